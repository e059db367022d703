/* The log scanner: Cap'n Proto messages back to back in a decompressed log stream, split
 * and peeked (logMonoTime, valid, which service) in one pass, every length and pointer
 * checked against the buffer (a log is untrusted input: nothing is read out of bounds).
 *
 * The rules are those of schemas/framing.py (message_length, root_data_section,
 * EventLayout.peek): a field is stored XOR its schema default, a field beyond the end of
 * an older writer's data section reads as its default. */
#ifndef MSGQ_LOG_SCAN_H
#define MSGQ_LOG_SCAN_H

#include <stddef.h>
#include <stdint.h>

/* Largest message a log may hold, and largest segment count (framing.py's bounds). */
#define LOG_MAX_MESSAGE_BYTES (512u * 1024u * 1024u)
#define LOG_MAX_SEGMENTS 512u

/* Where the root struct keeps the three peeked fields, and their declared defaults. */
typedef struct {
    uint32_t mono_byte;         /* byte offset of logMonoTime in the data section */
    uint32_t valid_byte;        /* byte and bit of valid */
    uint32_t valid_bit;
    uint32_t discriminant_byte; /* byte offset of the union discriminant */
    uint32_t services;          /* union members known: a larger discriminant is not peeked */
    uint64_t mono_default;
    uint8_t valid_default;
} log_event_layout;

/* One entry per message scanned. flags: LOG_VALID, LOG_ROOT_WHOLE. */
typedef struct {
    int64_t *offset;
    uint32_t *length;
    uint16_t *service;
    uint8_t *flags;
    uint64_t *mono_ns;
    size_t capacity;
} log_scan_out;

#define LOG_VALID 1u
/* The root struct (data and pointer sections) lies inside the first segment: a Cap'n
 * Proto reader's getRoot accepts it. */
#define LOG_ROOT_WHOLE 2u

enum log_scan_stop {
    LOG_SCAN_END = 0,         /* the scan reached the end of the buffer exactly */
    LOG_SCAN_INCOMPLETE = 1,  /* the buffer ends inside a message (or its header) */
    LOG_SCAN_BAD_FRAMING = 2, /* the bytes at the stop cannot start a message */
    LOG_SCAN_NOT_PEEKED = 3,  /* a whole message whose root this scanner does not follow */
    LOG_SCAN_FULL = 4,        /* the output arrays are full */
};

/* Length in bytes of the message at buf[offset]: > 0; 0 when buf ends before its header
 * or its data does; -1 for a segment count over LOG_MAX_SEGMENTS, -2 for a message with no
 * data, -3 for one over LOG_MAX_MESSAGE_BYTES. */
int64_t log_message_length(const uint8_t *buf, size_t len, size_t offset);

/* Peeks one whole message (len bytes). Returns 1 with the fields set (flags as above), 0
 * when its root is not a struct pointer into its first segment or its discriminant is
 * not one of the layout's services. */
int log_peek(const uint8_t *msg, size_t len, const log_event_layout *layout,
             uint64_t *mono_ns, uint16_t *service, uint8_t *flags);

/* Scans buf from pos, message after message, while each is whole and peeked, writing one
 * entry per message to out. Returns the number of messages; *stop is where the scan
 * stopped (the start of the message not taken) and *why says why (log_scan_stop). */
size_t log_scan(const uint8_t *buf, size_t len, size_t pos, const log_event_layout *layout,
                log_scan_out *out, size_t *stop, int *why);

/* How many words of a one-segment message (segment = its words, after the 8-byte header)
 * the root reaches: the root pointer and everything its pointers lead to, up to the
 * furthest word. -1 when a pointer leaves the segment, a far or capability pointer is met,
 * or following it would take more than 4 * words + 64 steps (pointers visited and
 * queued): bounded work on untrusted bytes. -2 when out of memory. */
int64_t log_message_extent(const uint8_t *segment, uint64_t words);

/* Whether bytes are a message, for what the scanner does not peek (a far root pointer, a
 * service of a newer schema) or for every message without a layout. keep: the answer is
 * about the message the scanner may hand over next (keep what was learned of it).
 * Returns 1 (a message), 0 (not one) or -1 (an error: the split stops with LOG_SPLIT_ERROR). */
typedef int (*log_identify_fn)(void *ctx, const uint8_t *msg, size_t len, int keep);

/* Splitting one decompressed piece of a log stream into messages, with every damage
 * decision: what is corrupt, where reading resynchronises after damage (a whole,
 * identified message at an 8-byte step, followed by another or by the end; looking back
 * into the message before the damage, whose length field may be what was hit), and what
 * is left for more bytes to complete. One pass over a buffer is log_split_begin, then
 * log_split_next until it returns LOG_SPLIT_WAIT (or LOG_SPLIT_ERROR). */
typedef struct {
    const log_event_layout *layout; /* NULL: identify() decides every message */
    log_identify_fn identify;
    void *ctx;
    int raw;                        /* uncompressed: the last message is kept to look back */
    /* the pass's state */
    int64_t pos, previous, origin, damage;
    int resyncing, final, failed;
    /* after LOG_SPLIT_WAIT: how many bytes of the buffer are done with (drop them), where
     * the next pass starts in what is left (carry, possibly past its end) and whether it
     * starts with the last message read (kept: 0, else -1) */
    int64_t keep, carry, kept;
} log_splitter;

enum log_split_action {
    LOG_SPLIT_RUN = 1,     /* out holds count messages, whole and peeked */
    LOG_SPLIT_MESSAGE = 2, /* one message (offset, length); peeked: fields set, else the
                            * identify(keep=1) call on it said what it is */
    LOG_SPLIT_CORRUPT = 3, /* no message starts at offset: detail, value say why */
    LOG_SPLIT_WAIT = 4,    /* the pass is over: keep, carry, kept are set */
    LOG_SPLIT_ERROR = 5,   /* identify returned -1 */
};

enum log_split_detail {
    LOG_DETAIL_SEGMENTS = 1,   /* value: the segment count */
    LOG_DETAIL_NO_DATA = 2,
    LOG_DETAIL_TOO_LARGE = 3,  /* value: the message's bytes */
    LOG_DETAIL_NOT_DECODED = 4,
    LOG_DETAIL_RUNS_PAST = 5,
};

typedef struct {
    int64_t offset;
    int64_t length;
    int peeked;
    uint64_t mono_ns;
    uint16_t service;
    uint8_t flags;
    int detail;
    uint64_t value;
    size_t count; /* LOG_SPLIT_RUN */
} log_split_result;

/* A splitter at the start of a stream. */
void log_split_init(log_splitter *sp, const log_event_layout *layout, log_identify_fn identify,
                    void *ctx, int raw);

/* Starts a pass over the buffer (what is left of the last one, with more bytes after it):
 * at carry, kept as the last pass left them; final: no more bytes will follow. */
void log_split_begin(log_splitter *sp, int final);

/* The piece of stream in the buffer (len bytes, a pass over it done) was cut short: the
 * file ends inside its zstd frame or bz2 stream. Returns 1 when that is to be reported
 * (not while resynchronising), with *left the bytes of an unfinished message it drops;
 * the buffer is then dropped (log_split_break). */
int log_split_cut(log_splitter *sp, size_t len, int64_t *left);

/* A damaged piece of stream follows the buffer: what is left of it is lost too (reading
 * resynchronises after the damage). */
void log_split_damaged(log_splitter *sp);

/* The bytes after the buffer do not continue it (a new zstd frame after a corrupt one):
 * the buffer is dropped, a partial message in it with it. */
void log_split_break(log_splitter *sp);

/* The file ended after the last pass (final) over the buffer: returns 1 when it ends
 * inside a message, with *at its offset in the buffer and *left its bytes dropped. */
int log_split_finish(const log_splitter *sp, size_t len, int64_t *at, int64_t *left);

/* The next thing the pass finds in buf (the same buffer for the whole pass). A run needs
 * out with room for (len - pos) / 16 + 1 messages when not resynchronising and a layout
 * is set (log_split_run_capacity). */
int log_split_next(log_splitter *sp, const uint8_t *buf, size_t len, log_scan_out *out,
                   log_split_result *res);

/* Room a run may need from the current position: 0 when no run can come next. */
size_t log_split_run_capacity(const log_splitter *sp, size_t len);

#endif
