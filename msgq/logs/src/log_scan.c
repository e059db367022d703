#include "log_scan.h"

#include <stdlib.h>
#include <string.h>

/* Little-endian loads from unaligned bytes (the buffer is any Python bytes object). */
static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* log_message_length, with the segment count (-1) or the byte count (-3) in *value. */
static int64_t message_length_ex(const uint8_t *buf, size_t len, size_t offset,
                                 uint64_t *value) {
    if (offset > len || len - offset < 4)
        return 0;
    size_t avail = len - offset;
    const uint8_t *p = buf + offset;
    /* u32 + 1 computed in 64 bits: 0xffffffff is 2^32 segments, not 0 */
    uint64_t count = (uint64_t)load_u32(p) + 1;
    if (count > LOG_MAX_SEGMENTS) {
        *value = count;
        return -1;
    }
    size_t header = (size_t)((4 + 4 * count + 7) & ~(uint64_t)7);
    if (avail < header)
        return 0;
    uint64_t words = 0; /* at most 512 * (2^32 - 1): no overflow */
    for (uint64_t i = 0; i < count; i++)
        words += load_u32(p + 4 + 4 * i);
    if (words == 0)
        return -2;
    uint64_t total = header + 8 * words;
    if (total > LOG_MAX_MESSAGE_BYTES) {
        *value = total;
        return -3;
    }
    if (avail < total)
        return 0;
    return (int64_t)total;
}

int64_t log_message_length(const uint8_t *buf, size_t len, size_t offset) {
    uint64_t value;
    return message_length_ex(buf, len, offset, &value);
}

int log_peek(const uint8_t *msg, size_t len, const log_event_layout *layout,
             uint64_t *mono_ns, uint16_t *service, uint8_t *flags) {
    if (len < 16)
        return 0;
    uint64_t count = (uint64_t)load_u32(msg) + 1;
    uint64_t base = (4 + 4 * count + 7) & ~(uint64_t)7; /* first word of segment 0 */
    if (count > LOG_MAX_SEGMENTS || base + 8 > len)
        return 0;
    uint64_t seg0_end = base + 8 * (uint64_t)load_u32(msg + 4);
    if (seg0_end > len)
        return 0;
    uint64_t pointer = load_u64(msg + base);
    if ((pointer & 3) != 0) /* a far pointer or garbage: not followed here */
        return 0;
    int64_t offset_words = (int64_t)((pointer >> 2) & 0x3FFFFFFF);
    if (offset_words & 0x20000000)
        offset_words -= 0x40000000;
    uint64_t data_words = (pointer >> 32) & 0xFFFF;
    uint64_t pointer_words = pointer >> 48;
    /* in int64: offset_words may be negative; |data| < 2^33, no overflow */
    int64_t data = (int64_t)base + 8 * (1 + offset_words);
    if (data < (int64_t)base + 8 || (uint64_t)data + 8 * data_words > seg0_end)
        return 0;
    const uint8_t *section = msg + data;
    uint64_t size = 8 * data_words; /* bytes of the data section */
    uint64_t mono = (uint64_t)layout->mono_byte + 8 <= size
        ? load_u64(section + layout->mono_byte) ^ layout->mono_default
        : layout->mono_default;
    uint8_t valid = (uint64_t)layout->valid_byte < size
        ? (uint8_t)(((section[layout->valid_byte] >> layout->valid_bit) & 1) ^
                    (layout->valid_default & 1))
        : (uint8_t)(layout->valid_default & 1);
    uint16_t which = (uint64_t)layout->discriminant_byte + 2 <= size
        ? load_u16(section + layout->discriminant_byte) : 0;
    if (which >= layout->services)
        return 0; /* a service of a newer schema: the caller decodes it */
    *mono_ns = mono;
    *service = which;
    uint8_t f = valid ? LOG_VALID : 0;
    if ((uint64_t)data + 8 * (data_words + pointer_words) <= seg0_end)
        f |= LOG_ROOT_WHOLE;
    *flags = f;
    return 1;
}

size_t log_scan(const uint8_t *buf, size_t len, size_t pos, const log_event_layout *layout,
                log_scan_out *out, size_t *stop, int *why) {
    size_t n = 0;
    for (;;) {
        if (pos >= len) {
            *why = LOG_SCAN_END;
            break;
        }
        if (n == out->capacity) {
            *why = LOG_SCAN_FULL;
            break;
        }
        int64_t length = log_message_length(buf, len, pos);
        if (length <= 0) {
            *why = length == 0 ? LOG_SCAN_INCOMPLETE : LOG_SCAN_BAD_FRAMING;
            break;
        }
        if (!log_peek(buf + pos, (size_t)length, layout, &out->mono_ns[n], &out->service[n],
                      &out->flags[n])) {
            *why = LOG_SCAN_NOT_PEEKED;
            break;
        }
        out->offset[n] = (int64_t)pos;
        out->length[n] = (uint32_t)length;
        n++;
        pos += (size_t)length;
    }
    *stop = pos;
    return n;
}

/* ---- the extent of a one-segment message ------------------------------------------ */

/* Pointers still to follow: runs of `count` groups of `per` pointer words, `stride`
 * words apart, from word `first` (a struct's pointer section: one group; a list of
 * pointers: per = 1; a composite list: one group per element). */
typedef struct {
    int64_t first;
    uint64_t count, per, stride;
    uint64_t i, j;
} extent_run;

int64_t log_message_extent(const uint8_t *segment, uint64_t words) {
    if (words == 0)
        return -1;
    int64_t budget = 4 * (int64_t)words + 64; /* words < 2^32 */
    int64_t reached = 1;
    size_t depth = 0, room = 64;
    extent_run *stack = malloc(room * sizeof *stack);
    if (!stack)
        return -2;
    stack[depth++] = (extent_run){0, 1, 1, 1, 0, 0};
    int64_t result = -1;
    while (depth) {
        extent_run *run = &stack[depth - 1];
        if (run->i == run->count) {
            depth--;
            continue;
        }
        int64_t at = run->first + (int64_t)(run->i * run->stride + run->j);
        if (++run->j == run->per) {
            run->j = 0;
            run->i++;
        }
        uint64_t pointer = load_u64(segment + 8 * at); /* at < words: checked when queued */
        if (pointer == 0)
            continue;
        int64_t offset = (int64_t)((pointer >> 2) & 0x3FFFFFFF);
        if (offset & 0x20000000)
            offset -= 0x40000000;
        int64_t target = at + 1 + offset;
        int64_t end;
        extent_run next = {0, 0, 0, 0, 0, 0};
        uint64_t children = 0;
        if ((pointer & 3) == 0) { /* struct */
            uint64_t data_words = (pointer >> 32) & 0xFFFF, pointer_words = pointer >> 48;
            end = target + (int64_t)(data_words + pointer_words);
            next = (extent_run){target + (int64_t)data_words, 1, pointer_words, 0, 0, 0};
            children = pointer_words;
        } else if ((pointer & 3) == 1) { /* list */
            uint64_t element = (pointer >> 32) & 7, count = pointer >> 35;
            if (element == 7) { /* composite: a tag word, then count words of structs */
                end = target + 1 + (int64_t)count;
                if (target < 0 || end > (int64_t)words)
                    goto done;
                uint64_t tag = load_u64(segment + 8 * target);
                uint64_t elements = (tag >> 2) & 0x3FFFFFFF;
                uint64_t data_words = (tag >> 32) & 0xFFFF, pointer_words = tag >> 48;
                uint64_t size = data_words + pointer_words;
                if ((tag & 3) || elements * size > count)
                    goto done;
                if (pointer_words) {
                    next = (extent_run){target + 1 + (int64_t)data_words, elements,
                                        pointer_words, size, 0, 0};
                    children = elements * pointer_words;
                }
            } else {
                static const uint64_t bits[7] = {0, 1, 8, 16, 32, 64, 64};
                end = target + (int64_t)((count * bits[element] + 63) / 64);
                if (element == 6) {
                    next = (extent_run){target, count, 1, 1, 0, 0};
                    children = count;
                }
            }
        } else { /* far pointer or capability: not followed here */
            goto done;
        }
        if (target < 0 || end > (int64_t)words)
            goto done;
        budget -= 1 + (int64_t)children;
        if (budget < 0)
            goto done;
        if (end > reached)
            reached = end;
        if (children) {
            if (depth == room) {
                extent_run *more = realloc(stack, 2 * room * sizeof *stack);
                if (!more) {
                    result = -2;
                    goto done;
                }
                stack = more;
                room *= 2;
            }
            stack[depth++] = next;
        }
    }
    result = reached;
done:
    free(stack);
    return result;
}

/* ---- splitting with damage decisions ---------------------------------------------- */

#define WHOLE_NONE 0 /* the data ends before the message does */
#define WHOLE_ERROR (-100)

/* Is a message at pos? > 0: its length (identified); WHOLE_NONE; < 0: -detail (why not,
 * *value set), or WHOLE_ERROR. keep: the candidate the pass may hand over (res filled). */
static int64_t whole(log_splitter *sp, const uint8_t *buf, size_t len, int64_t pos, int keep,
                     log_split_result *res, uint64_t *value) {
    int64_t length = message_length_ex(buf, len, (size_t)pos, value);
    if (length == 0)
        return WHOLE_NONE;
    if (length < 0)
        return length == -1 ? -LOG_DETAIL_SEGMENTS
             : length == -2 ? -LOG_DETAIL_NO_DATA : -LOG_DETAIL_TOO_LARGE;
    if (sp->layout) {
        uint64_t mono;
        uint16_t service;
        uint8_t flags;
        if (log_peek(buf + pos, (size_t)length, sp->layout, &mono, &service, &flags)) {
            if (keep) {
                res->peeked = 1;
                res->mono_ns = mono;
                res->service = service;
                res->flags = flags;
            }
            return length;
        }
    }
    if (keep)
        res->peeked = 0;
    int r = sp->identify(sp->ctx, buf + pos, (size_t)length, keep);
    if (r < 0) {
        sp->failed = 1;
        return WHOLE_ERROR;
    }
    return r ? length : -LOG_DETAIL_NOT_DECODED;
}

/* A message found while resynchronising counts when another whole message (or the end)
 * follows it: 1 yes, 0 no, 2 undecided until more bytes come, WHOLE_ERROR. */
static int followed(log_splitter *sp, const uint8_t *buf, size_t len, int64_t end) {
    if (end >= (int64_t)len)
        return sp->final || end == (int64_t)len ? 1 : 2;
    uint64_t value;
    int64_t after = whole(sp, buf, len, end, 0, NULL, &value);
    if (after == WHOLE_ERROR)
        return WHOLE_ERROR;
    if (after == WHOLE_NONE)
        return sp->final ? 0 : 2;
    return after > 0;
}

/* Whether a whole message starts at an 8-byte step after pos (1, 0 or WHOLE_ERROR). */
static int message_after(log_splitter *sp, const uint8_t *buf, size_t len, int64_t pos) {
    uint64_t value;
    for (int64_t p = pos + 8; p < (int64_t)len; p += 8) {
        int64_t found = whole(sp, buf, len, p, 0, NULL, &value);
        if (found == WHOLE_ERROR)
            return WHOLE_ERROR;
        if (found > 0)
            return 1;
    }
    return 0;
}

/* Whether the message at start, cut at end (given the one-segment header that says so),
 * is whole and tight: then its header was what the damage hit. */
static int fits(const uint8_t *buf, size_t len, int64_t start, int64_t end) {
    if (start < 0 || end > (int64_t)len || end - start < 16 || (end - start) % 8)
        return 0;
    uint64_t words = (uint64_t)(end - start - 8) / 8;
    return log_message_extent(buf + start + 8, words) == (int64_t)words;
}

/* Whether a whole message, followed by another or the end, starts inside the message at
 * previous (-1: none) where that one, cut there, fits exactly: its length was wrong. */
static int overlapping(log_splitter *sp, const uint8_t *buf, size_t len, int64_t previous,
                       int64_t pos) {
    if (previous < 0)
        return 0;
    uint64_t value;
    for (int64_t p = previous + 8; p < pos; p += 8) {
        int64_t found = whole(sp, buf, len, p, 0, NULL, &value);
        if (found == WHOLE_ERROR)
            return WHOLE_ERROR;
        if (found > 0 && fits(buf, len, previous, p)) {
            int f = followed(sp, buf, len, p + found);
            if (f == WHOLE_ERROR)
                return WHOLE_ERROR;
            if (f == 1)
                return 1;
        }
    }
    return 0;
}

void log_split_init(log_splitter *sp, const log_event_layout *layout, log_identify_fn identify,
                    void *ctx, int raw) {
    memset(sp, 0, sizeof *sp);
    sp->layout = layout;
    sp->identify = identify;
    sp->ctx = ctx;
    sp->raw = raw;
    sp->previous = sp->origin = sp->damage = sp->kept = -1;
}

void log_split_begin(log_splitter *sp, int final) {
    sp->pos = sp->carry;
    sp->previous = sp->kept;
    sp->origin = sp->damage = -1;
    sp->final = final;
    sp->failed = 0;
    sp->keep = 0;
}

void log_split_break(log_splitter *sp) {
    sp->carry = 0;
    sp->kept = -1;
    sp->resyncing = 0;
}

int log_split_cut(log_splitter *sp, size_t len, int64_t *left) {
    int report = !sp->resyncing;
    *left = (int64_t)len;
    log_split_break(sp);
    return report;
}

void log_split_damaged(log_splitter *sp) {
    sp->resyncing = 1;
}

int log_split_finish(const log_splitter *sp, size_t len, int64_t *at, int64_t *left) {
    *at = sp->carry;
    *left = (int64_t)len - sp->carry; /* after the message kept to look back into, if any */
    return *left > 0 && !sp->resyncing;
}

size_t log_split_run_capacity(const log_splitter *sp, size_t len) {
    if (sp->resyncing || !sp->layout || sp->pos >= (int64_t)len)
        return 0;
    return (len - (size_t)sp->pos) / 16 + 1;
}

static int wait(log_splitter *sp, size_t len) {
    int64_t n = (int64_t)len;
    int64_t keep = sp->raw && sp->previous >= 0 && !sp->resyncing && sp->pos <= n
        ? sp->previous : (sp->pos < n ? sp->pos : n);
    sp->carry = sp->pos - keep;
    sp->kept = keep == sp->previous ? 0 : -1;
    sp->keep = keep;
    return LOG_SPLIT_WAIT;
}

int log_split_next(log_splitter *sp, const uint8_t *buf, size_t len, log_scan_out *out,
                   log_split_result *res) {
    if (sp->failed)
        return LOG_SPLIT_ERROR;
    uint64_t value = 0;
    while (sp->pos < (int64_t)len) {
        int64_t pos = sp->pos;
        if (!sp->resyncing && sp->layout) {
            /* the common case: every whole message the scanner peeks, in one run */
            size_t stop;
            int why;
            if (out->capacity < log_split_run_capacity(sp, len))
                return LOG_SPLIT_ERROR; /* the caller's arrays are too small */
            size_t n = log_scan(buf, len, (size_t)pos, sp->layout, out, &stop, &why);
            if (n) {
                sp->previous = out->offset[n - 1];
                sp->pos = (int64_t)stop;
                res->count = n;
                return LOG_SPLIT_RUN;
            }
        }
        if (!sp->resyncing) { /* message after message: what the run left */
            int64_t length = log_message_length(buf, len, (size_t)pos);
            if (length > 0) {
                int64_t found = whole(sp, buf, len, pos, 1, res, &value);
                if (found == WHOLE_ERROR)
                    return LOG_SPLIT_ERROR;
                if (found > 0) {
                    res->offset = pos;
                    res->length = found;
                    sp->previous = pos;
                    sp->pos = pos + found;
                    return LOG_SPLIT_MESSAGE;
                }
            }
        }
        int64_t found = whole(sp, buf, len, pos, 1, res, &value);
        if (found == WHOLE_ERROR)
            return LOG_SPLIT_ERROR;
        int chained = 1;
        if (found > 0 && sp->resyncing) {
            chained = followed(sp, buf, len, pos + found);
            if (chained == WHOLE_ERROR)
                return LOG_SPLIT_ERROR;
            if (chained == 2 && pos >= sp->damage)
                break; /* decided when more data has come */
        }
        if (found > 0 && (pos >= sp->damage || fits(buf, len, sp->origin, pos))
                && chained == 1) {
            sp->resyncing = 0;
            res->offset = pos;
            res->length = found;
            sp->previous = pos;
            sp->pos = pos + found;
            return LOG_SPLIT_MESSAGE;
        }
        int detail = found < 0 ? (int)-found : 0;
        if (found == WHOLE_NONE && !sp->resyncing) {
            if (!sp->final)
                break; /* more bytes may complete it */
            int after = message_after(sp, buf, len, pos);
            if (after == WHOLE_ERROR)
                return LOG_SPLIT_ERROR;
            if (!after) {
                after = overlapping(sp, buf, len, sp->previous, pos);
                if (after == WHOLE_ERROR)
                    return LOG_SPLIT_ERROR;
            }
            if (!after)
                break; /* the data was cut inside it */
            detail = LOG_DETAIL_RUNS_PAST;
        }
        if (!sp->resyncing) {
            res->offset = pos;
            res->detail = detail;
            res->value = value;
            sp->resyncing = 1;
            if (sp->previous >= 0) {
                /* Damage right after a message may be in that message's length field (a
                 * message a word too long swallows the start of the next one, or more):
                 * look for the next message from inside it, where it would end if its
                 * length were right. */
                sp->origin = sp->previous;
                sp->damage = pos;
                sp->pos = sp->previous + 8;
            } else {
                sp->pos = pos + 8;
            }
            return LOG_SPLIT_CORRUPT;
        }
        sp->pos = pos + 8;
    }
    return wait(sp, len);
}
