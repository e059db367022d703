# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled JSON writer of the MCAP export: Cap'n Proto message bytes → the exact JSON
text :class:`msgq.viz.json_schema.EventConverter` makes of them (same keys in the same
order, enums as names, Data as base64, 64-bit integers exact, floats as the encoder in
use writes them, non-finite floats as strings), read straight from the bytes without a
pycapnp reader or a Python dict per event, a whole batch of messages per call.

The bytes come from files: untrusted. Every pointer, far pointers and their landing pads
included, is checked against the segment it points into (at most 64 segments), the words
read are budgeted (4 times the message, within pycapnp's traversal limit; lists of
zero-sized elements are charged per element) and nesting is bounded (60). Anything this
writer does not follow — a segment table or pointer out of bounds, a list encoded with
another element size than its type's, a pointer of the wrong kind, text that is not
strict UTF-8 with its NUL (or holds a NUL), a generic's parameter, a null pointer whose
list or struct field has an explicit default, a root of another service than the
scanner said, a budget or depth exceeded — gives None for that message, and the caller
converts it the old way (pycapnp and the EventConverter), so the text is the same byte
for byte and an error is the one it always was. The wire format (kind and element size
codes, pointer decoding, bounds checks) is schemas/_capnp_wire.pxd's, which the typed
reader reads too; far pointers and several segments are this writer's own.

Float text: orjson's (shortest round trip, ``1e16`` — ``1e+16`` from orjson 3.13 on —,
``1e-7``, ``0.00001``) where the
EventConverter would use orjson (orjson installed, the service's JSON Schema holds no
null, the text has no ``null`` in it and no non-finite float), else the standard
library's (``float.__repr__``: ``1e+16``, ``1e-07``, ``1e-05``).
"""

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, strlen, strchr
from libc.stdlib cimport malloc, realloc, free
from libc.math cimport isfinite, isnan
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free
from cpython.ref cimport Py_INCREF

# The wire format, shared with the typed reader: Cython finds it from the source tree's
# root (the runtime package msgq.schemas is setup.py's mapping of schemas/).
from schemas._capnp_wire cimport *

cdef extern from "Python.h":
    char *PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0

cdef extern from "string.h":
    void *memmem(const void *haystack, size_t haystacklen, const void *needle,
                 size_t needlelen) nogil

# Kinds of fields, list elements and values: schemas/_capnp_wire.pxd's, by name.
KINDS = {"bool": KIND_BOOL, "int8": KIND_INT8, "int16": KIND_INT16,
         "int32": KIND_INT32, "int64": KIND_INT64, "uint8": KIND_UINT8,
         "uint16": KIND_UINT16, "uint32": KIND_UINT32, "uint64": KIND_UINT64,
         "float32": KIND_FLOAT32, "float64": KIND_FLOAT64, "text": KIND_TEXT,
         "data": KIND_DATA, "enum": KIND_ENUM, "list": KIND_LIST, "struct": KIND_STRUCT,
         "group": KIND_GROUP, "void": KIND_VOID, "null": KIND_NULL, "other": KIND_OTHER}

cdef int MAX_DEPTH = 60  # below capnp's nesting limit of 64: deeper falls back

# Return codes of the walk: 0 written, FOLLOW_NOT: leave this message to the old path.
cdef enum:
    FOLLOW_NOT = 1

cdef const char *B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef const char *HEX = b"0123456789abcdef"
cdef const char *PAIRS = (b"00010203040506070809101112131415161718192021222324252627282930313233"
                          b"34353637383940414243444546474849505152535455565758596061626364656667"
                          b"6869707172737475767778798081828384858687888990919293949596979899")


# -- shortest round-trip digits of a double (Giulietti's Schubfach algorithm) -----------
# The digits repr() and orjson write (both the shortest decimal that reads back as the
# same double, the closest of them on a tie): about 20 times faster than
# PyOS_double_to_string for 17-digit values, which float32 fields widen to. The table
# g(k) = floor(10**-k * 2**-r) + 1, r = flog2pow10(-k) - 125, is made once at import.

cdef extern from *:
    """
    typedef unsigned __int128 msgq_u128;
    static inline unsigned long long msgq_mul_high(unsigned long long a,
                                                   unsigned long long b) {
        return (unsigned long long)(((msgq_u128)a * b) >> 64);
    }
    """
    uint64_t mul_high "msgq_mul_high"(uint64_t a, uint64_t b) noexcept nogil

cdef enum:
    K_MIN = -324
    K_MAX = 292
    Q_MIN = -1074

cdef uint64_t G1[K_MAX - K_MIN + 1]
cdef uint64_t G0[K_MAX - K_MIN + 1]
cdef uint64_t MASK_63 = (<uint64_t>1 << 63) - 1
cdef uint64_t C_MIN = <uint64_t>1 << 52


cdef inline int64_t flog10pow2(int64_t e) noexcept nogil:
    return (e * <int64_t>661971961083) >> 41


cdef inline int64_t flog10three_quarters_pow2(int64_t e) noexcept nogil:
    return (e * <int64_t>661971961083 - <int64_t>274743187321) >> 41


cdef inline int64_t flog2pow10(int64_t e) noexcept nogil:
    return (e * <int64_t>913124641741) >> 38


def _fill_g_table() -> None:
    cdef object k, r, scaled, g
    for k in range(int(K_MIN), int(K_MAX) + 1):
        r = ((-k * 913124641741) >> 38) - 125
        if k <= 0:
            scaled = (10 ** -k << -r) if r <= 0 else (10 ** -k >> r)
        else:
            scaled = (1 << -r) // 10 ** k
        g = scaled + 1
        G1[<int>k - K_MIN] = <uint64_t>(g >> 63)
        G0[<int>k - K_MIN] = <uint64_t>(g & ((1 << 63) - 1))


_fill_g_table()


cdef inline uint64_t rop(uint64_t g1, uint64_t g0, uint64_t cp) noexcept nogil:
    cdef uint64_t x1 = mul_high(g0, cp)
    cdef uint64_t y0 = g1 * cp
    cdef uint64_t y1 = mul_high(g1, cp)
    cdef uint64_t z = (y0 >> 1) + x1
    cdef uint64_t vbp = y1 + (z >> 63)
    return vbp | (((z & MASK_63) + MASK_63) >> 63)


cdef inline int shortest(uint64_t c, int q, uint64_t *digits, int *exponent) noexcept nogil:
    """The shortest decimal ``digits`` * 10**``exponent`` of the normal double c * 2**q
    (c with its hidden bit)."""
    cdef uint64_t out = c & 1
    cdef uint64_t cb = c << 2
    cdef uint64_t cbr = cb + 2
    cdef uint64_t cbl, vb, vbl, vbr, s, t, sp10, tp10, g1, g0
    cdef int64_t k, h
    cdef bint upin, wpin, uin, win
    cdef int64_t cmp
    if c != C_MIN or q == Q_MIN:
        cbl = cb - 2
        k = flog10pow2(q)
    else:
        cbl = cb - 1
        k = flog10three_quarters_pow2(q)
    h = q + flog2pow10(-k) + 2
    g1 = G1[k - K_MIN]
    g0 = G0[k - K_MIN]
    vb = rop(g1, g0, cb << h)
    vbl = rop(g1, g0, cbl << h)
    vbr = rop(g1, g0, cbr << h)
    s = vb >> 2
    if s >= 100:
        sp10 = 10 * mul_high(s, (<uint64_t>115292150460684698) << 4)
        tp10 = sp10 + 10
        upin = vbl + out <= sp10 << 2
        wpin = (tp10 << 2) + out <= vbr
        if upin != wpin:
            digits[0] = sp10 if upin else tp10
            exponent[0] = <int>k
            return 0
    t = s + 1
    uin = vbl + out <= s << 2
    win = (t << 2) + out <= vbr
    if uin != win:
        digits[0] = s if uin else t
        exponent[0] = <int>k
        return 0
    cmp = <int64_t>vb - <int64_t>((s + t) << 1)
    digits[0] = s if (cmp < 0 or (cmp == 0 and (s & 1) == 0)) else t
    exponent[0] = <int>k
    return 0


# Whether the installed orjson writes a plus sign in positive exponents (``1e+16``: from
# orjson 3.13 on; ``1e16`` before): the orjson style follows the encoder the old path uses.
cdef bint ORJSON_EXPONENT_PLUS = False
try:
    import orjson as _orjson
    ORJSON_EXPONENT_PLUS = _orjson.dumps(1e16) == b"1e+16"
except ImportError:  # no orjson: the old path writes repr's text, and so does this one
    pass


cdef int format_double(double d, bint orjson_style, char *out) noexcept nogil:
    """A finite double as repr() (``orjson_style`` false) or orjson writes it, into
    ``out`` (at least 32 bytes); returns the length, or -1 for a value left to
    PyOS_double_to_string (subnormals)."""
    cdef uint64_t bits, c, f
    cdef uint32_t low, pair
    cdef int biased, q, e, n = 0, decpt, i, at = 0, x
    cdef char buf[24]
    memcpy(&bits, &d, 8)
    biased = <int>((bits >> 52) & 0x7FF)
    c = bits & ((<uint64_t>1 << 52) - 1)
    if bits >> 63:
        out[at] = b'-'
        at += 1
    if biased == 0:
        if c != 0:
            return -1  # subnormal: rare, and repr's shortest has its own rules there
        memcpy(out + at, b"0.0", 3)
        return at + 3
    c |= C_MIN
    q = biased - 1075
    if -52 <= q < 0 and (c >> (-q)) << (-q) == c:
        f = c >> (-q)  # an integer below 2**53: its own digits are the shortest
        e = 0
    else:
        shortest(c, q, &f, &e)
    while f % 10 == 0:
        f //= 10
        e += 1
    # the digits, least significant first, two at a time (in 32-bit pieces of 8)
    while f >= 100000000:
        low = <uint32_t>(f % 100000000)
        f //= 100000000
        for i in range(4):
            pair = 2 * (low % 100)
            low //= 100
            buf[n] = PAIRS[pair + 1]
            buf[n + 1] = PAIRS[pair]
            n += 2
    low = <uint32_t>f
    while low >= 100:
        pair = 2 * (low % 100)
        low //= 100
        buf[n] = PAIRS[pair + 1]
        buf[n + 1] = PAIRS[pair]
        n += 2
    if low >= 10:
        buf[n] = PAIRS[2 * low + 1]
        buf[n + 1] = PAIRS[2 * low]
        n += 2
    elif low:
        buf[n] = <char>(48 + low)
        n += 1
    # buf holds the n digits backwards; the value is 0.DIGITS * 10**decpt
    decpt = n + e
    if (decpt > 16) or (decpt <= (-5 if orjson_style else -4)):
        out[at] = buf[n - 1]
        at += 1
        if n > 1:
            out[at] = b'.'
            at += 1
            for i in range(n - 2, -1, -1):
                out[at] = buf[i]
                at += 1
        out[at] = b'e'
        at += 1
        x = decpt - 1
        if x < 0:
            out[at] = b'-'
            at += 1
            x = -x
        elif not orjson_style or ORJSON_EXPONENT_PLUS:
            out[at] = b'+'
            at += 1
        if x >= 100:
            out[at] = <char>(48 + x // 100)
            at += 1
            x %= 100
            out[at] = <char>(48 + x // 10)
            out[at + 1] = <char>(48 + x % 10)
            at += 2
        elif x >= 10 or not orjson_style:
            out[at] = <char>(48 + x // 10)
            out[at + 1] = <char>(48 + x % 10)
            at += 2
        else:
            out[at] = <char>(48 + x)
            at += 1
        return at
    if decpt <= 0:
        out[at] = b'0'
        out[at + 1] = b'.'
        at += 2
        for i in range(-decpt):
            out[at] = b'0'
            at += 1
        for i in range(n - 1, -1, -1):
            out[at] = buf[i]
            at += 1
        return at
    for i in range(n):
        if i == decpt:
            out[at] = b'.'
            at += 1
        out[at] = buf[n - 1 - i]
        at += 1
    if decpt >= n:
        for i in range(decpt - n):
            out[at] = b'0'
            at += 1
        out[at] = b'.'
        out[at + 1] = b'0'
        at += 2
    return at


def double_text(double value, bint orjson_style=False) -> bytes:
    """``value`` (finite) as the writer writes it: repr()'s text, or orjson's (tests)."""
    cdef char out[40]
    cdef int n = format_double(value, orjson_style, out)
    if n < 0:
        text = repr(value).encode()
        if orjson_style:
            import orjson
            text = orjson.dumps(value)
        return text
    return out[:n]


cdef class JType:
    """A compiled value type: its kind and what it needs (enum names, list element,
    struct)."""
    cdef int kind
    cdef list enum_names  # enum: by number, the quoted name as bytes, or None
    cdef Py_ssize_t n_enum
    cdef JType element  # list
    cdef JStruct struct_  # struct, group


cdef class JField:
    """A compiled field: its key text, where it lies, its default's bits."""
    cdef bytes key  # '"name":' (union members: '"_which":"name","name":')
    cdef int kind
    cdef Py_ssize_t where  # data offset in units of the value's size, or pointer index
    cdef uint64_t default
    cdef bint explicit_default  # a pointer field with an explicit default
    cdef bytes default_text  # its JSON text, where known (Text, Data); else None
    cdef JType type


cdef class JStruct:
    """A compiled struct or group: its non-union fields in order, and its union."""
    cdef tuple fields
    cdef bint has_union
    cdef Py_ssize_t discriminant_offset
    cdef dict members  # discriminant -> JField

    def set(self, tuple fields, object union):
        """Fills this struct (made empty first, so that recursive types can refer to
        it): ``fields`` (JField), ``union`` None or (discriminant offset, {discriminant:
        JField})."""
        self.fields = fields
        self.has_union = union is not None
        self.members = {} if union is None else dict(union[1])
        self.discriminant_offset = 0 if union is None else union[0]


def make_type(int kind, object enum_names=None, JType element=None,
              JStruct struct_=None) -> JType:
    """A compiled value type (see :mod:`msgq.viz.json_writer`)."""
    cdef JType t = JType.__new__(JType)
    t.kind = kind
    t.enum_names = list(enum_names or ())
    t.n_enum = len(t.enum_names)
    t.element = element
    t.struct_ = struct_
    return t


def make_field(bytes key, JType type, Py_ssize_t where, uint64_t default,
               bint explicit_default, bytes default_text=None) -> JField:
    """A compiled field (see :mod:`msgq.viz.json_writer`); ``default_text``: the JSON
    text of a pointer field's explicit default (None: the old path reads it)."""
    cdef JField f = JField.__new__(JField)
    f.key = key
    f.type = type
    f.kind = type.kind
    f.where = where
    f.default = default
    f.explicit_default = explicit_default
    f.default_text = default_text
    return f


def make_struct() -> JStruct:
    """An empty compiled struct, filled later with :meth:`JStruct.set`."""
    cdef JStruct s = JStruct.__new__(JStruct)
    s.fields = ()
    s.members = {}
    s.has_union = False
    s.discriminant_offset = 0
    return s


cdef struct Target:
    uint64_t tag  # the struct or list pointer (or a far pointer's landing pad's tag)
    Py_ssize_t at  # byte offset of what it points to
    Py_ssize_t seg_start  # the segment that lies in
    Py_ssize_t seg_end


cdef enum:
    MAX_SEGMENTS = 64  # more: the old path reads the message


cdef class _Writer:
    """One batch's output buffer and the walk over one message at a time."""
    cdef char *out
    cdef Py_ssize_t len, cap
    cdef const uint8_t *buf
    cdef Py_ssize_t n_segments
    cdef Py_ssize_t seg_start[MAX_SEGMENTS]
    cdef Py_ssize_t seg_end[MAX_SEGMENTS]
    cdef Py_ssize_t budget
    cdef int depth
    cdef bint orjson_style
    cdef bint saw_null  # a null or a non-finite float was written

    def __dealloc__(self):
        free(self.out)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t cap
        cdef char *grown
        if self.len + n <= self.cap:
            return 0
        cap = self.cap * 2 if self.cap else 65536
        while cap < self.len + n:
            cap *= 2
        grown = <char *>realloc(self.out, cap)
        if grown == NULL:
            raise MemoryError()
        self.out = grown
        self.cap = cap
        return 0

    cdef inline int put(self, const char *text, Py_ssize_t n) except -1:
        if self.len + n > self.cap:
            self.reserve(n)
        memcpy(self.out + self.len, text, n)
        self.len += n
        return 0

    cdef inline int put_char(self, char c) except -1:
        if self.len + 1 > self.cap:
            self.reserve(1)
        self.out[self.len] = c
        self.len += 1
        return 0

    cdef inline int put_bytes(self, bytes b) except -1:
        return self.put(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))

    cdef int put_null(self) except -1:
        self.saw_null = True
        return self.put(b"null", 4)

    cdef int put_uint(self, uint64_t v) except -1:
        cdef char tmp[24]
        cdef int i = 24
        if v == 0:
            return self.put_char(b'0')
        while v:
            i -= 1
            tmp[i] = <char>(48 + v % 10)
            v //= 10
        return self.put(tmp + i, 24 - i)

    cdef int put_int(self, int64_t v) except -1:
        if v < 0:
            self.put_char(b'-')
            return self.put_uint(<uint64_t>0 - <uint64_t>v)
        return self.put_uint(<uint64_t>v)

    cdef int put_double(self, double d) except -1:
        cdef char *text
        cdef char *e
        cdef Py_ssize_t n, mantissa, digits, i
        cdef int exponent, sign
        if not isfinite(d):
            self.saw_null = True  # orjson writes null: the old path uses the stdlib's text
            if isnan(d):
                return self.put(b'"NaN"', 5)
            if d > 0:
                return self.put(b'"Infinity"', 10)
            return self.put(b'"-Infinity"', 11)
        if self.len + 40 > self.cap:
            self.reserve(40)
        n = format_double(d, self.orjson_style, self.out + self.len)
        if n >= 0:
            self.len += n
            return 0
        text = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
        try:
            n = strlen(text)
            e = strchr(text, b'e')
            if not self.orjson_style or e == NULL:
                self.put(text, n)
                return 0
            # repr's d[.ddd]e±XX → orjson's d[.ddd]eX (e+X from orjson 3.13), except
            # 1e-5 <= |d| < 1e-4, which
            # orjson writes as 0.0000ddd
            mantissa = e - text
            sign = 1 if e[1] == b'+' else -1
            exponent = 0
            i = 2
            while i < n - mantissa:
                exponent = exponent * 10 + (e[i] - 48)
                i += 1
            if sign < 0 and exponent == 5:
                i = 0
                if text[0] == b'-':
                    self.put_char(b'-')
                    i = 1
                self.put(b"0.0000", 6)
                while i < mantissa:
                    if text[i] != b'.':
                        self.put_char(text[i])
                    i += 1
                return 0
            self.put(text, mantissa + 1)
            if sign < 0:
                self.put_char(b'-')
            elif ORJSON_EXPONENT_PLUS:
                self.put_char(b'+')
            self.put_uint(<uint64_t>exponent)
            return 0
        finally:
            PyMem_Free(text)

    cdef int put_base64(self, const uint8_t *p, Py_ssize_t n) except -1:
        cdef Py_ssize_t i = 0
        cdef uint32_t v
        cdef char *o
        self.reserve(2 + (n + 2) // 3 * 4)
        o = self.out + self.len
        o[0] = b'"'
        o += 1
        while i + 3 <= n:
            v = (<uint32_t>p[i] << 16) | (<uint32_t>p[i + 1] << 8) | p[i + 2]
            o[0] = B64[(v >> 18) & 63]
            o[1] = B64[(v >> 12) & 63]
            o[2] = B64[(v >> 6) & 63]
            o[3] = B64[v & 63]
            o += 4
            i += 3
        if n - i == 1:
            v = <uint32_t>p[i] << 16
            o[0] = B64[(v >> 18) & 63]
            o[1] = B64[(v >> 12) & 63]
            o[2] = b'='
            o[3] = b'='
            o += 4
        elif n - i == 2:
            v = (<uint32_t>p[i] << 16) | (<uint32_t>p[i + 1] << 8)
            o[0] = B64[(v >> 18) & 63]
            o[1] = B64[(v >> 12) & 63]
            o[2] = B64[(v >> 6) & 63]
            o[3] = b'='
            o += 4
        o[0] = b'"'
        o += 1
        self.len = o - self.out
        return 0

    cdef int put_text(self, const uint8_t *p, Py_ssize_t n) except -1:
        """A capnp Text's bytes (without its NUL) as a JSON string, UTF-8 kept; returns
        FOLLOW_NOT for bytes that are not strict UTF-8 or hold a NUL."""
        cdef Py_ssize_t i = 0, run = 0
        cdef uint8_t c, c1, c2, c3
        cdef uint32_t cp
        self.put_char(b'"')
        while i < n:
            c = p[i]
            if c >= 0x80:
                # strict UTF-8: no overlong forms, no surrogates, at most U+10FFFF
                if c >= 0xC2 and c <= 0xDF:
                    if i + 1 >= n or (p[i + 1] & 0xC0) != 0x80:
                        return FOLLOW_NOT
                    i += 2
                elif c >= 0xE0 and c <= 0xEF:
                    if i + 2 >= n:
                        return FOLLOW_NOT
                    c1 = p[i + 1]
                    c2 = p[i + 2]
                    if (c1 & 0xC0) != 0x80 or (c2 & 0xC0) != 0x80:
                        return FOLLOW_NOT
                    cp = ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (c2 & 0x3F)
                    if cp < 0x800 or (cp >= 0xD800 and cp <= 0xDFFF):
                        return FOLLOW_NOT
                    i += 3
                elif c >= 0xF0 and c <= 0xF4:
                    if i + 3 >= n:
                        return FOLLOW_NOT
                    c1 = p[i + 1]
                    c2 = p[i + 2]
                    c3 = p[i + 3]
                    if (c1 & 0xC0) != 0x80 or (c2 & 0xC0) != 0x80 or (c3 & 0xC0) != 0x80:
                        return FOLLOW_NOT
                    cp = ((c & 0x07) << 18) | ((c1 & 0x3F) << 12) | ((c2 & 0x3F) << 6) \
                        | (c3 & 0x3F)
                    if cp < 0x10000 or cp > 0x10FFFF:
                        return FOLLOW_NOT
                    i += 4
                else:
                    return FOLLOW_NOT
                continue
            if c == 0:
                return FOLLOW_NOT
            if c < 0x20 or c == b'"' or c == b'\\':
                self.put(<const char *>p + run, i - run)
                self.put_escape(c)
                i += 1
                run = i
                continue
            i += 1
        self.put(<const char *>p + run, n - run)
        self.put_char(b'"')
        return 0

    cdef int put_escape(self, uint8_t c) except -1:
        cdef char tmp[6]
        if c == b'"':
            return self.put(b'\\"', 2)
        if c == b'\\':
            return self.put(b'\\\\', 2)
        if c == b'\n':
            return self.put(b'\\n', 2)
        if c == b'\r':
            return self.put(b'\\r', 2)
        if c == b'\t':
            return self.put(b'\\t', 2)
        if c == 8:
            return self.put(b'\\b', 2)
        if c == 12:
            return self.put(b'\\f', 2)
        tmp[0] = b'\\'
        tmp[1] = b'u'
        tmp[2] = b'0'
        tmp[3] = b'0'
        tmp[4] = HEX[c >> 4]
        tmp[5] = HEX[c & 15]
        return self.put(tmp, 6)

    # -- the walk -------------------------------------------------------------------

    cdef inline int spend(self, Py_ssize_t words) noexcept:
        self.budget -= words
        return FOLLOW_NOT if self.budget < 0 else 0

    cdef int follow(self, Py_ssize_t at, Py_ssize_t seg_start, Py_ssize_t seg_end,
                    Target *t) noexcept:
        """Where the non-null pointer at byte ``at`` (of the segment [seg_start, seg_end))
        points, through a far pointer's landing pad where it is one; FOLLOW_NOT for a
        pad or segment out of bounds."""
        cdef uint64_t w = load64(self.buf + at)
        cdef uint64_t far
        cdef Py_ssize_t segment, pad
        if (w & 3) != 2:
            t.tag = w
            t.at = pointer_target(at, w)
            t.seg_start = seg_start
            t.seg_end = seg_end
            return 0
        segment = <Py_ssize_t>(w >> 32)
        if segment >= self.n_segments:
            return FOLLOW_NOT
        pad = self.seg_start[segment] + 8 * <Py_ssize_t>((w >> 3) & 0x1FFFFFFF)
        if self.spend(1):
            return FOLLOW_NOT
        if (w & 4) == 0:  # one landing pad: a pointer relative to itself
            if pad + 8 > self.seg_end[segment]:
                return FOLLOW_NOT
            w = load64(self.buf + pad)
            if (w & 3) == 2 or (w & 3) == 3:
                return FOLLOW_NOT
            t.tag = w
            t.at = pointer_target(pad, w)
            t.seg_start = self.seg_start[segment]
            t.seg_end = self.seg_end[segment]
            return 0
        # two words: a far pointer to the content, then the tag describing it
        if pad + 16 > self.seg_end[segment]:
            return FOLLOW_NOT
        far = load64(self.buf + pad)
        w = load64(self.buf + pad + 8)
        if (far & 7) != 2 or (w & 3) == 2 or (w & 3) == 3:
            return FOLLOW_NOT
        segment = <Py_ssize_t>(far >> 32)
        if segment >= self.n_segments:
            return FOLLOW_NOT
        t.tag = w
        t.at = self.seg_start[segment] + 8 * <Py_ssize_t>((far >> 3) & 0x1FFFFFFF)
        t.seg_start = self.seg_start[segment]
        t.seg_end = self.seg_end[segment]
        return 0

    cdef int struct_at(self, Py_ssize_t at, Py_ssize_t seg_start, Py_ssize_t seg_end,
                       Struct *s) noexcept:
        """The struct the pointer at byte ``at`` points to (a null pointer: an empty
        struct, so that every field reads as its default)."""
        cdef uint64_t w = load64(self.buf + at)
        cdef Py_ssize_t words
        cdef Target t
        empty_struct(s, at, seg_start, seg_end)
        if w == 0:
            return 0
        if self.follow(at, seg_start, seg_end, &t):
            return FOLLOW_NOT
        words = struct_in(t.tag, t.at, t.seg_start, t.seg_end, s)
        if words < 0:
            return FOLLOW_NOT  # not a struct pointer, or not inside its segment
        return self.spend(words)

    cdef int write_struct(self, const Struct *s, JStruct layout) except -1:
        cdef Py_ssize_t i, n
        cdef JField field
        cdef int rc
        self.depth += 1
        if self.depth > MAX_DEPTH:
            return FOLLOW_NOT
        self.put_char(b'{')
        n = len(layout.fields)
        for i in range(n):
            field = <JField>layout.fields[i]
            if i:
                self.put_char(b',')
            self.put_bytes(field.key)
            rc = self.write_field(s, field)
            if rc:
                return rc
        if layout.has_union:
            if n:
                self.put_char(b',')
            field = layout.members.get(
                <uint16_t>data_bits(self.buf, s, 2 * layout.discriminant_offset, 2))
            if field is None:  # a member this schema does not know (a newer writer's)
                self.put(b'"_which":', 9)
                self.put_null()
            else:
                self.put_bytes(field.key)
                rc = self.write_field(s, field)
                if rc:
                    return rc
        self.put_char(b'}')
        self.depth -= 1
        return 0

    cdef int write_field(self, const Struct *s, JField field) except -1:
        cdef int kind = field.kind
        cdef Py_ssize_t where = field.where
        cdef Struct empty
        if kind == KIND_BOOL:
            if data_bit(self.buf, s, where) ^ (field.default & 1):
                return self.put(b"true", 4)
            return self.put(b"false", 5)
        if kind <= KIND_FLOAT64 or kind == KIND_ENUM:
            return self.primitive(s, kind, where, field.default, field.type)
        if kind == KIND_GROUP:
            return self.write_struct(s, field.type.struct_)
        if kind == KIND_VOID or kind == KIND_NULL:
            return self.put_null()
        if kind == KIND_OTHER:
            return FOLLOW_NOT
        # pointer fields: where is the pointer index
        if where >= s.ptr_count or load64(self.buf + s.ptrs + 8 * where) == 0:
            if field.explicit_default:
                if field.default_text is None:
                    return FOLLOW_NOT  # a list's or struct's default: the old path reads it
                return self.put_bytes(field.default_text)
            if kind == KIND_TEXT or kind == KIND_DATA:
                return self.put(b'""', 2)
            if kind == KIND_LIST:
                return self.put(b"[]", 2)
            empty_struct(&empty, 0, s.seg_start, s.seg_end)
            return self.write_struct(&empty, field.type.struct_)
        return self.pointer_value(s.ptrs + 8 * where, s.seg_start, s.seg_end, field.type)

    cdef int primitive(self, const Struct *s, int kind, Py_ssize_t where, uint64_t default,
                       JType type) except -1:
        cdef Number n
        read_number(self.buf, s, kind, where, default, &n)
        if kind == KIND_ENUM:
            return self.put_enum(<uint16_t>n.as_uint, type)
        if n.form == NUMBER_SIGNED:
            return self.put_int(n.as_int)
        if n.form == NUMBER_UNSIGNED:
            return self.put_uint(n.as_uint)
        return self.put_double(n.as_float)

    cdef inline int put_enum(self, uint16_t value, JType type) except -1:
        cdef object name
        if value < type.n_enum:
            name = type.enum_names[value]
            if name is not None:
                return self.put_bytes(<bytes>name)
        return self.put_uint(value)  # an enumerant this schema does not name

    cdef int pointer_value(self, Py_ssize_t at, Py_ssize_t seg_start, Py_ssize_t seg_end,
                           JType type) except -1:
        """The value of the non-null pointer at byte ``at`` (of the segment [seg_start,
        seg_end))."""
        cdef Struct s
        cdef int rc
        if type.kind == KIND_STRUCT:
            rc = self.struct_at(at, seg_start, seg_end, &s)
            if rc:
                return rc
            return self.write_struct(&s, type.struct_)
        return self.list_at(at, seg_start, seg_end, type)

    cdef int list_at(self, Py_ssize_t at, Py_ssize_t seg_start, Py_ssize_t seg_end,
                     JType type) except -1:
        cdef Py_ssize_t target, count, i, words, n, end
        cdef int size, ekind, rc, kind = type.kind
        cdef uint64_t w
        cdef JType element
        cdef Struct s
        cdef Composite c
        cdef Target t
        if self.follow(at, seg_start, seg_end, &t):
            return FOLLOW_NOT
        w = t.tag
        if (w & 3) != 1:
            return FOLLOW_NOT
        target = t.at
        end = t.seg_end
        size = list_size(w)
        count = list_count(w)
        if target < t.seg_start:
            return FOLLOW_NOT
        if kind == KIND_TEXT or kind == KIND_DATA:
            n = blob_in(self.buf, w, target, end, kind == KIND_TEXT)
            if n < 0:
                return FOLLOW_NOT  # not bytes, past the segment, or text without its NUL
            if self.spend((count + 7) // 8):
                return FOLLOW_NOT
            if kind == KIND_DATA:
                return self.put_base64(self.buf + target, n)
            return self.put_text(self.buf + target, n)
        element = type.element
        ekind = element.kind
        if size != element_size(ekind):
            return FOLLOW_NOT  # another encoding than the type's: the old path converts
        self.put_char(b'[')
        if ekind == KIND_STRUCT:
            words = composite_in(self.buf, target, count, t.seg_start, end, &c)
            if words < 0 or self.spend(words):
                return FOLLOW_NOT
            s.data_bytes = c.data_bytes
            s.ptr_count = c.ptr_count
            s.seg_start = t.seg_start
            s.seg_end = end
            for i in range(c.count):
                if i:
                    self.put_char(b',')
                s.data = c.first + i * c.step
                s.ptrs = s.data + s.data_bytes
                rc = self.write_struct(&s, element.struct_)
                if rc:
                    return rc
            return self.put_char(b']')
        words = list_words(size, count)
        if target + 8 * words > end:
            return FOLLOW_NOT
        if self.spend(count if count > words else words):
            return FOLLOW_NOT
        if size == SZ_POINTER:
            for i in range(count):
                if i:
                    self.put_char(b',')
                if load64(self.buf + target + 8 * i) == 0:
                    if ekind == KIND_LIST:
                        self.put(b"[]", 2)
                    else:
                        self.put(b'""', 2)
                    continue
                rc = self.list_at(target + 8 * i, t.seg_start, end, element)
                if rc:
                    return rc
            return self.put_char(b']')
        empty_struct(&s, target, t.seg_start, end)
        s.data_bytes = 8 * words  # the elements as a data section: primitive() reads them
        for i in range(count):
            if i:
                self.put_char(b',')
            if ekind == KIND_BOOL:
                if data_bit(self.buf, &s, i):
                    self.put(b"true", 4)
                else:
                    self.put(b"false", 5)
                continue
            self.primitive(&s, ekind, i, 0, element)
        return self.put_char(b']')

    cdef int message(self, const uint8_t *buf, Py_ssize_t length, JStruct root,
                     int expected, bint orjson_style) except -1:
        """One message's JSON at the end of the buffer (0), or FOLLOW_NOT (the buffer is
        left as it was)."""
        cdef Py_ssize_t mark = self.len
        cdef uint64_t head
        cdef Struct s
        cdef int rc
        cdef Py_ssize_t count, i, at, size, total = 0
        if length < 16:
            return FOLLOW_NOT
        head = load64(buf)
        count = <Py_ssize_t>(head & 0xFFFFFFFF) + 1
        if count > MAX_SEGMENTS:
            return FOLLOW_NOT
        at = 8 * ((count + 2) // 2)  # the segment table: 4 bytes per segment, plus 4
        if at > length:
            return FOLLOW_NOT
        for i in range(count):
            size = 8 * load32(buf + 4 + 4 * i)
            if at + size > length:
                return FOLLOW_NOT  # a segment past the message
            self.seg_start[i] = at
            self.seg_end[i] = at + size
            at += size
            total += size
        if self.seg_end[0] - self.seg_start[0] < 8:
            return FOLLOW_NOT  # no root pointer
        self.n_segments = count
        self.buf = buf
        # words read: at most 4 times the message (pycapnp's limit is at least that)
        self.budget = total // 2
        self.depth = 0
        self.orjson_style = orjson_style
        self.saw_null = False
        rc = self.struct_at(self.seg_start[0], self.seg_start[0], self.seg_end[0], &s)
        if rc == 0 and expected >= 0 and \
                <int>data_bits(self.buf, &s, 2 * root.discriminant_offset, 2) != expected:
            rc = FOLLOW_NOT  # not the service the scanner peeked
        if rc == 0:
            rc = self.write_struct(&s, root)
        if rc:
            self.len = mark
        return rc


def convert_batch(JStruct root, const uint8_t[::1] data, const int64_t[::1] offset,
                  const uint32_t[::1] length, const int64_t[::1] which,
                  const int16_t[::1] expected, const uint8_t[::1] orjson_style):
    """The JSON texts of messages ``which`` (indexes into ``offset``/``length``, the
    messages' places in ``data``) as a list of bytes, None for a message left to the old
    path. ``expected[i]``: the root discriminant message ``which[i]`` must hold (-1: any);
    ``orjson_style[i]``: whether the old path would try orjson for it (see the module
    docstring)."""
    cdef Py_ssize_t n = which.shape[0]
    cdef Py_ssize_t i, k, at, size, mark
    cdef _Writer w = _Writer.__new__(_Writer)
    cdef int rc
    cdef bint style
    cdef object text
    out = PyList_New(n)
    for i in range(n):
        k = which[i]
        if k < 0 or k >= offset.shape[0]:
            raise IndexError("message index out of range")
        at = offset[k]
        size = length[k]
        if at < 0 or at + size > data.shape[0]:
            raise IndexError("message out of the batch's bytes")
        w.len = 0
        style = orjson_style[i] != 0
        rc = w.message(&data[0] + at, size, root, expected[i], style)
        if rc == 0 and style and (w.saw_null or
                                  memmem(w.out, w.len, b"null", 4) != NULL):
            # orjson's text would hold null: the old path writes the stdlib's instead
            w.len = 0
            rc = w.message(&data[0] + at, size, root, expected[i], False)
        if rc == 0:
            text = PyBytes_FromStringAndSize(w.out, w.len)
        else:
            text = None
        Py_INCREF(text)
        PyList_SET_ITEM(out, i, text)
    return out
