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

#endif
