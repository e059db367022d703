#include "log_scan.h"

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

int64_t log_message_length(const uint8_t *buf, size_t len, size_t offset) {
    if (offset > len || len - offset < 4)
        return 0;
    size_t avail = len - offset;
    const uint8_t *p = buf + offset;
    /* u32 + 1 computed in 64 bits: 0xffffffff is 2^32 segments, not 0 */
    uint64_t count = (uint64_t)load_u32(p) + 1;
    if (count > LOG_MAX_SEGMENTS)
        return -1;
    size_t header = (size_t)((4 + 4 * count + 7) & ~(uint64_t)7);
    if (avail < header)
        return 0;
    uint64_t words = 0; /* at most 512 * (2^32 - 1): no overflow */
    for (uint64_t i = 0; i < count; i++)
        words += load_u32(p + 4 + 4 * i);
    if (words == 0)
        return -2;
    uint64_t total = header + 8 * words;
    if (total > LOG_MAX_MESSAGE_BYTES)
        return -3;
    if (avail < total)
        return 0;
    return (int64_t)total;
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
