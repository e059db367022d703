/* The log scanner (msgq/logs/src/log_scan.c) on damaged and random log streams: built
 * plain and under ASan/UBSan by `scons test`, a libFuzzer target with `scons fuzz`
 * (build/fuzz/fuzz_log_scan). Every buffer is allocated to its exact size, so a read one
 * byte past it is an ASan report.
 *
 * Properties: the splitter hands out messages and runs inside the buffer, in increasing
 * order, corrupt spots inside it, and ends every pass (a bounded number of actions); the
 * identify callback is only ever shown whole messages inside the buffer; the extent of a
 * message is -1 or between 1 and its words. Plus a few fixed streams with known answers
 * (intact, cut, a length word one off, garbage in the middle). */
#define _POSIX_C_SOURCE 200809L /* rand_r */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "log_scan.h"

static const log_event_layout LAYOUT = {
    .mono_byte = 0, .valid_byte = 8, .valid_bit = 0, .discriminant_byte = 10,
    .services = 4, .mono_default = 0, .valid_default = 1};

typedef struct {
    const uint8_t *buf;
    size_t len;
    unsigned calls;
    int bad; /* identify was shown bytes outside the buffer */
} ident_ctx;

/* Says yes to a one-segment message whose root reaches exactly its size (how a writer
 * lays it out), no to others; fails (-1) never, unless asked by the input. */
static int identify(void *p, const uint8_t *msg, size_t len, int keep) {
    ident_ctx *ctx = p;
    (void)keep;
    ctx->calls++;
    if (msg < ctx->buf || len > ctx->len || msg + len > ctx->buf + ctx->len || len < 16)
        ctx->bad = 1;
    uint32_t count, words;
    memcpy(&count, msg, 4);
    memcpy(&words, msg + 4, 4);
    if (count != 0 || 8 + 8 * (uint64_t)words != len)
        return 0;
    int64_t extent = log_message_extent(msg + 8, words);
    return extent == (int64_t)words;
}

/* One pass over buf[0:len] to its end; checks what comes out. Returns the bytes kept. */
static size_t split_pass(log_splitter *sp, ident_ctx *ctx, const uint8_t *buf, size_t len,
                         int final, size_t *messages, size_t *problems) {
    size_t cap = len / 16 + 1;
    log_scan_out out = {malloc(cap * 8), malloc(cap * 4), malloc(cap * 2), malloc(cap),
                        malloc(cap * 8), cap};
    ctx->buf = buf;
    ctx->len = len;
    log_split_begin(sp, final);
    int64_t last_start = -1; /* starts grow (a message found by looking back into the one
                              * before may end before it did) */
    size_t actions = 0;
    for (;;) {
        log_split_result res;
        int action = log_split_next(sp, buf, len, &out, &res);
        CHECK(++actions <= 4 * len + 64);
        if (actions > 4 * len + 64)
            break;
        if (action == LOG_SPLIT_RUN) {
            CHECK(res.count >= 1 && res.count <= cap);
            for (size_t i = 0; i < res.count; i++) {
                CHECK(out.offset[i] >= 0 && out.offset[i] + out.length[i] <= (int64_t)len);
                CHECK(out.offset[i] > last_start);
                CHECK(out.service[i] < LAYOUT.services);
                last_start = out.offset[i];
            }
            *messages += res.count;
        } else if (action == LOG_SPLIT_MESSAGE) {
            CHECK(res.offset >= 0 && res.length >= 16 && res.offset + res.length <= (int64_t)len);
            CHECK(res.offset > last_start);
            last_start = res.offset;
            (*messages)++;
        } else if (action == LOG_SPLIT_CORRUPT) {
            CHECK(res.offset >= 0 && res.offset <= (int64_t)len);
            CHECK(res.detail >= LOG_DETAIL_SEGMENTS && res.detail <= LOG_DETAIL_RUNS_PAST);
            (*problems)++;
        } else {
            CHECK(action == LOG_SPLIT_WAIT);
            CHECK(sp->keep >= 0 && sp->keep <= (int64_t)len && sp->carry >= 0);
            break;
        }
    }
    for (int i = 0; i < 5; i++)
        free(i == 0 ? (void *)out.offset : i == 1 ? (void *)out.length
             : i == 2 ? (void *)out.service : i == 3 ? (void *)out.flags : (void *)out.mono_ns);
    return (size_t)sp->keep;
}

/* Splits data the way the Python wrapper does: in pieces (cut at `cuts`), each appended
 * to what the last pass kept, in an exactly-sized buffer; the last pass final. */
static void split_stream(const uint8_t *data, size_t size, const size_t *cuts, int n_cuts,
                         int with_layout, int raw, size_t *messages, size_t *problems) {
    log_splitter sp;
    ident_ctx ctx = {0};
    log_split_init(&sp, with_layout ? &LAYOUT : NULL, identify, &ctx, raw);
    uint8_t *held = NULL;
    size_t held_len = 0, from = 0;
    for (int piece = 0; piece <= n_cuts; piece++) {
        size_t to = piece < n_cuts ? cuts[piece] : size;
        if (to > size)
            to = size;
        if (to < from)
            to = from;
        size_t len = held_len + (to - from);
        uint8_t *buf = malloc(len ? len : 1);
        if (held_len)
            memcpy(buf, held, held_len);
        if (to > from)
            memcpy(buf + held_len, data + from, to - from);
        free(held);
        from = to;
        size_t keep = split_pass(&sp, &ctx, buf, len, piece == n_cuts, messages, problems);
        held_len = len - keep;
        held = malloc(held_len ? held_len : 1);
        memcpy(held, buf + keep, held_len);
        free(buf);
    }
    int64_t at, left;
    if (log_split_finish(&sp, held_len, &at, &left))
        CHECK(at >= 0 && left > 0 && at + left == (int64_t)held_len);
    CHECK(!ctx.bad);
    free(held);
}

/* A message: one segment, root struct of 2 data words and 1 pointer, the pointer to a
 * byte list of `extra` bytes. */
static size_t make_message(uint8_t *out, uint64_t mono, uint16_t service, size_t extra) {
    size_t list_words = (extra + 7) / 8;
    uint32_t words = (uint32_t)(1 + 3 + list_words);
    memset(out, 0, 8 + 8 * (size_t)words);
    memcpy(out + 4, &words, 4);
    uint64_t root = ((uint64_t)1 << 48) | ((uint64_t)2 << 32); /* offset 0, 2 data, 1 ptr */
    memcpy(out + 8, &root, 8);
    memcpy(out + 16, &mono, 8);
    out[24] = 0; /* valid: stored XOR its default true */
    memcpy(out + 26, &service, 2);
    if (extra) {
        uint64_t list = 1 | ((uint64_t)2 << 32) | ((uint64_t)extra << 35); /* offset 0 */
        memcpy(out + 32, &list, 8);
        for (size_t i = 0; i < extra; i++)
            out[40 + i] = (uint8_t)(i * 7 + 1);
    }
    return 8 + 8 * (size_t)words;
}

/* A stream of n messages; starts[i] where each begins. */
static size_t make_stream(uint8_t *out, size_t n, size_t *starts, unsigned seed) {
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (starts)
            starts[i] = at;
        at += make_message(out + at, 1000 + i, (uint16_t)(i % 4), (i * 13 + seed) % 40);
    }
    return at;
}

static void test_extent(void) {
    uint8_t msg[512];
    size_t len = make_message(msg, 5, 1, 20);
    CHECK(log_message_extent(msg + 8, (len - 8) / 8) == (int64_t)(len - 8) / 8);
    CHECK(log_message_extent(msg + 8, (len - 8) / 8 - 1) == -1); /* the list leaves it */
    uint64_t far = 2;
    memcpy(msg + 8, &far, 8);
    CHECK(log_message_extent(msg + 8, (len - 8) / 8) == -1);
    CHECK(log_message_extent(msg + 8, 0) == -1);
}

static void test_intact_and_cut(void) {
    static uint8_t data[8192];
    size_t starts[40];
    size_t size = make_stream(data, 40, starts, 3);
    for (int layout = 0; layout < 2; layout++) {
        size_t messages = 0, problems = 0;
        split_stream(data, size, NULL, 0, layout, 0, &messages, &problems);
        CHECK(messages == 40 && problems == 0);
        /* cut inside the last message: 39 messages, no corrupt spot (a truncation) */
        messages = problems = 0;
        size_t cuts[2] = {starts[10] + 5, starts[20] + 3};
        split_stream(data, starts[39] + 20, cuts, 2, layout, 1, &messages, &problems);
        CHECK(messages == 39 && problems == 0);
    }
}

static void test_damage_is_skipped(void) {
    static uint8_t data[8192];
    size_t starts[40];
    size_t size = make_stream(data, 40, starts, 5);
    /* message 12's size one word too long: the damage is reported once where message 13
     * should start, and the reader looks back into 12 and finds 13 (the cut fits) */
    uint32_t words;
    memcpy(&words, data + starts[12] + 4, 4);
    words += 1;
    memcpy(data + starts[12] + 4, &words, 4);
    for (int layout = 0; layout < 2; layout++) {
        size_t messages = 0, problems = 0;
        split_stream(data, size, NULL, 0, layout, 1, &messages, &problems);
        /* with the layout message 12 peeks, so it is handed out (a word too long);
         * without it, identify refuses it (not tight) */
        CHECK(messages == (layout ? 40u : 39u) && problems == 1);
    }
    /* a zeroed header: no data */
    size = make_stream(data, 40, starts, 5);
    memset(data + starts[30], 0, 8);
    size_t messages = 0, problems = 0;
    split_stream(data, size, NULL, 0, 1, 0, &messages, &problems);
    CHECK(messages == 39 && problems == 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* The input's first byte picks: a stream of real messages damaged by the rest of the
 * input (pairs of offset, xor byte), or the input itself as the stream. */
int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size) {
    if (size < 2)
        return 0;
    static uint8_t stream[1 << 16];
    size_t len;
    if (input[0] & 1) {
        len = make_stream(stream, 20 + input[1] % 40, NULL, input[1]);
        for (size_t i = 2; i + 2 < size; i += 3) {
            size_t at = ((size_t)input[i] | (size_t)input[i + 1] << 8) % len;
            stream[at] ^= input[i + 2];
        }
        if (input[0] & 2)
            len -= input[1] % 64 < len ? input[1] % 64 : 0;
    } else {
        len = size - 2 < sizeof stream ? size - 2 : sizeof stream;
        memcpy(stream, input + 2, len);
    }
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, stream, len);
    size_t cuts[3] = {len / 3, len / 2 + (input[1] & 7), len - (len > 5 ? 5 : 0)};
    size_t messages = 0, problems = 0;
    split_stream(exact, len, cuts, input[0] & 4 ? 3 : 0, input[0] & 8 ? 0 : 1,
                 input[0] & 16 ? 1 : 0, &messages, &problems);
    /* the extent of every 8-byte step taken as a one-segment message */
    for (size_t at = 0; at + 16 <= len; at += 8) {
        uint64_t words = (len - at - 8) / 8;
        int64_t e = log_message_extent(exact + at + 8, words);
        CHECK(e == -1 || (e >= 1 && e <= (int64_t)words));
    }
    free(exact);
#ifdef MSGQ_LIBFUZZER
    if (failed_here) /* a failed check is a finding */
        abort();
#endif
    return 0;
}

#ifndef MSGQ_LIBFUZZER
int main(int argc, char **argv) {
    unsigned runs = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 3000u;
    RUN(test_extent);
    RUN(test_intact_and_cut);
    RUN(test_damage_is_skipped);
    unsigned seed = 31;
    static uint8_t input[2048];
    current_test = "random streams";
    failed_here = 0;
    for (unsigned r = 0; r < runs; r++) {
        size_t len = 2 + (size_t)rand_r(&seed) % (sizeof input - 2);
        for (size_t i = 0; i < len; i++)
            input[i] = (uint8_t)rand_r(&seed);
        if (r % 4 == 0) /* a few damaged bytes of a real stream */
            len = 2 + 3 * (1 + (size_t)rand_r(&seed) % 4);
        input[0] = (uint8_t)(r % 4 == 0 ? (input[0] | 1) : input[0]);
        LLVMFuzzerTestOneInput(input, len);
    }
    if (failed_here)
        failed++;
    else
        passed++;
    printf("fuzz_log_scan: %u streams; %d passed, %d failed\n", runs, passed, failed);
    return failed != 0;
}
#endif
