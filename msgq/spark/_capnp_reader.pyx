# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Typed columns straight from a message's bytes: the values a union member of the root
struct converts to (capnp_types.py's rules), read by following the Cap'n Proto encoding
with a layout built from the schema, instead of through pycapnp one attribute at a time.

The bytes come from files: untrusted. Every pointer is checked against the segment, the
words read are budgeted (8 times the message, as a traversal limit) and nesting is bounded.
Anything this reader does not follow — several segments, far pointers, a list encoded
with another element size than its type's, an unknown union member, text that is not
UTF-8 with its NUL, a budget or depth exceeded — makes ``read_member`` return FALLBACK,
and the caller converts that message with pycapnp as before (same values, same errors).
So the result is pycapnp's for every message, only faster for the common ones.

Layouts are tuples (see capnp_types.py, which builds them beside the Spark types):
field ``(kind, where, default, extra)``, struct ``(fields, union)``, union
``(discriminant_offset, {discriminant: (name, index or -1, field or None)}, count)``.
"""

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8

# Field and element kinds.
K_BOOL = 0
K_INT8 = 1
K_INT16 = 2
K_INT32 = 3
K_INT64 = 4
K_UINT8 = 5
K_UINT16 = 6
K_UINT32 = 7
K_UINT64 = 8
K_FLOAT32 = 9
K_FLOAT64 = 10
K_TEXT = 11
K_DATA = 12
K_ENUM = 13
K_LIST = 14
K_STRUCT = 15
K_GROUP = 16

#: What read_member returns for a message it leaves to pycapnp.
FALLBACK = object()

cdef int MAX_DEPTH = 64
# capnp list element size codes
cdef int SZ_BIT = 1, SZ_BYTE = 2, SZ_TWO = 3, SZ_FOUR = 4, SZ_EIGHT = 5, SZ_POINTER = 6
cdef int SZ_COMPOSITE = 7


cdef inline int element_size(int kind) noexcept:
    """The list element size code of a list of ``kind`` elements."""
    if kind == 0:
        return SZ_BIT
    if kind == 1 or kind == 5:
        return SZ_BYTE
    if kind == 2 or kind == 6 or kind == 13:
        return SZ_TWO
    if kind == 3 or kind == 7 or kind == 9:
        return SZ_FOUR
    if kind == 4 or kind == 8 or kind == 10:
        return SZ_EIGHT
    return SZ_POINTER  # text, data, lists


class _Unfollowed(Exception):
    """A message this reader leaves to pycapnp."""


cdef struct Struct:
    Py_ssize_t data       # byte offset of the data section
    Py_ssize_t data_bytes
    Py_ssize_t ptrs       # byte offset of the pointer section
    Py_ssize_t ptr_count


cdef inline uint64_t load64(const uint8_t *p) nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v


cdef class _Walk:
    """One message: its segment's bounds, the word budget, the depth."""
    cdef const uint8_t *buf
    cdef Py_ssize_t start, end
    cdef Py_ssize_t budget
    cdef int depth

    cdef int spend(self, Py_ssize_t words) except -1:
        self.budget -= words
        if self.budget < 0:
            raise _Unfollowed()
        return 0

    cdef Struct struct_at(self, Py_ssize_t at) except *:
        """The struct the pointer at byte ``at`` points to (a null pointer: an empty
        struct, so every field reads as its default)."""
        cdef Struct s
        cdef uint64_t w = load64(self.buf + at)
        cdef Py_ssize_t target, dw, pw
        s.data = s.ptrs = at
        s.data_bytes = s.ptr_count = 0
        if w == 0:
            return s
        if (w & 3) != 0:
            raise _Unfollowed()  # a far pointer, or not a struct pointer
        target = at + 8 + 8 * <Py_ssize_t>(<int32_t>(<uint32_t>w) >> 2)
        dw = (w >> 32) & 0xFFFF
        pw = (w >> 48) & 0xFFFF
        if target < self.start or target + 8 * (dw + pw) > self.end:
            raise _Unfollowed()
        self.spend(dw + pw if dw + pw > 0 else 1)
        s.data = target
        s.data_bytes = 8 * dw
        s.ptrs = target + 8 * dw
        s.ptr_count = pw
        return s

    cdef object read_struct(self, Struct s, tuple layout):
        cdef tuple fields = layout[0]
        cdef object union = layout[1]
        cdef Py_ssize_t n = len(fields)
        cdef Py_ssize_t count, i
        cdef uint16_t which
        cdef tuple member
        if union is None:
            out = [None] * n
            for i in range(n):
                out[i] = self.read_field(s, <tuple>fields[i])
            return tuple(out)
        count = union[2]
        out = [None] * (n + 1 + count)
        for i in range(n):
            out[i] = self.read_field(s, <tuple>fields[i])
        which = <uint16_t>self.raw_bits(s, 2 * <Py_ssize_t>union[0], 2)
        member = union[1].get(which)
        if member is None:
            raise _Unfollowed()  # a member of a newer schema: pycapnp says what it does
        out[n] = member[0]
        if member[1] >= 0:
            out[n + 1 + <Py_ssize_t>member[1]] = self.read_field(s, <tuple>member[2])
        return tuple(out)

    cdef uint64_t raw_bits(self, Struct s, Py_ssize_t byte, int width) except? 0xFFFFFFFFFFFFFFFF:
        """``width`` bytes at ``byte`` of the data section, zero beyond it."""
        cdef uint64_t v = 0
        if byte + width <= s.data_bytes:
            memcpy(&v, self.buf + s.data + byte, width)
        return v

    cdef object read_field(self, Struct s, tuple field):
        cdef int kind = field[0]
        cdef Py_ssize_t where = field[1]
        cdef Py_ssize_t bit
        cdef uint64_t raw
        if kind == K_BOOL:
            bit = where
            raw = 0
            if bit // 8 < s.data_bytes:
                raw = (self.buf[s.data + bit // 8] >> (bit % 8)) & 1
            return bool(raw ^ <uint64_t>field[2])
        if kind <= K_FLOAT64 or kind == K_ENUM:
            return self.primitive(s, kind, where, <uint64_t>field[2], field[3])
        if kind == K_GROUP:
            return self.read_struct(s, <tuple>field[3])
        # pointer fields: where is the pointer index
        if where >= s.ptr_count:
            return self.null_value(kind, field[3])
        return self.pointer_value(s.ptrs + 8 * where, kind, field[3])

    cdef object primitive(self, Struct s, int kind, Py_ssize_t where, uint64_t default,
                          object extra):
        cdef uint64_t raw
        cdef float f
        cdef double d
        cdef uint32_t raw32
        if kind == K_INT8 or kind == K_UINT8:
            raw = self.raw_bits(s, where, 1) ^ default
            if kind == K_INT8:
                return <int8_t>raw
            return <uint8_t>raw
        if kind == K_INT16 or kind == K_UINT16 or kind == K_ENUM:
            raw = self.raw_bits(s, 2 * where, 2) ^ default
            if kind == K_ENUM:
                name = extra.get(<uint16_t>raw)
                return name if name is not None else str(<uint16_t>raw)
            if kind == K_INT16:
                return <int16_t>raw
            return <uint16_t>raw
        if kind == K_INT32 or kind == K_UINT32 or kind == K_FLOAT32:
            raw32 = <uint32_t>(self.raw_bits(s, 4 * where, 4) ^ default)
            if kind == K_FLOAT32:
                memcpy(&f, &raw32, 4)
                return <double>f
            if kind == K_INT32:
                return <int32_t>raw32
            return raw32
        raw = self.raw_bits(s, 8 * where, 8) ^ default
        if kind == K_FLOAT64:
            memcpy(&d, &raw, 8)
            return d
        if kind == K_INT64:
            return <int64_t>raw
        return raw

    cdef object null_value(self, int kind, object extra):
        if kind == K_TEXT:
            return ""
        if kind == K_DATA:
            return b""
        if kind == K_LIST:
            return []
        cdef Struct empty
        empty.data = empty.ptrs = 0
        empty.data_bytes = empty.ptr_count = 0
        return self.nested(empty, <tuple>extra)  # a struct of defaults

    cdef object nested(self, Struct s, tuple layout):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Unfollowed()
        value = self.read_struct(s, layout)
        self.depth -= 1
        return value

    cdef object pointer_value(self, Py_ssize_t at, int kind, object extra):
        cdef uint64_t w = load64(self.buf + at)
        if w == 0:
            return self.null_value(kind, extra)
        if kind == K_STRUCT:
            return self.nested(self.struct_at(at), <tuple>extra)
        return self.list_at(at, w, kind, extra)

    cdef object list_at(self, Py_ssize_t at, uint64_t w, int kind, object extra):
        """The value of a list pointer: text, data, or a list of ``extra`` elements."""
        cdef Py_ssize_t target, count, i, words, dw, pw, step
        cdef int size, ekind
        cdef tuple element
        cdef Struct s
        if (w & 3) != 1:
            raise _Unfollowed()
        target = at + 8 + 8 * <Py_ssize_t>(<int32_t>(<uint32_t>w) >> 2)
        size = (w >> 32) & 7
        count = <Py_ssize_t>(w >> 35)
        if target < self.start:
            raise _Unfollowed()
        if kind == K_TEXT or kind == K_DATA:
            if size != SZ_BYTE or target + count > self.end:
                raise _Unfollowed()
            self.spend((count + 7) // 8)
            if kind == K_DATA:
                return PyBytes_FromStringAndSize(<const char *>self.buf + target, count)
            if count == 0 or self.buf[target + count - 1] != 0:
                raise _Unfollowed()  # text needs its NUL
            try:
                return PyUnicode_DecodeUTF8(<const char *>self.buf + target, count - 1, NULL)
            except UnicodeDecodeError:
                raise _Unfollowed()
        element = <tuple>extra
        ekind = element[0]
        if ekind == K_STRUCT:
            if size != SZ_COMPOSITE:
                raise _Unfollowed()
            words = count  # the word count, after the tag
            if target + 8 + 8 * words > self.end:
                raise _Unfollowed()
            w = load64(self.buf + target)
            if (w & 3) != 0:
                raise _Unfollowed()
            count = <Py_ssize_t>((w >> 2) & 0x3FFFFFFF)
            dw = (w >> 32) & 0xFFFF
            pw = (w >> 48) & 0xFFFF
            step = 8 * (dw + pw)
            if count * (dw + pw) > words:
                raise _Unfollowed()
            # A list of zero-sized structs claims any count in no bytes: its elements
            # are charged one word each (as capnp's amplified reads are), so that a few
            # bytes cannot make millions of tuples.
            self.spend((count if count > words else words) + 1)
            out = [None] * count
            s.data_bytes = 8 * dw
            s.ptr_count = pw
            for i in range(count):
                s.data = target + 8 + i * step
                s.ptrs = s.data + 8 * dw
                out[i] = self.nested(s, <tuple>element[3])
            return out
        if ekind > K_DATA and ekind != K_LIST and ekind != K_ENUM:
            raise _Unfollowed()
        if ekind == K_LIST or ekind == K_ENUM:
            if size != (SZ_POINTER if ekind == K_LIST else SZ_TWO):
                raise _Unfollowed()
        elif size != element_size(ekind):
            raise _Unfollowed()
        if size == SZ_BIT:
            words = (count + 63) // 64
        elif size == SZ_POINTER:
            words = count
        else:
            words = (count * (1 << (size - 2)) + 7) // 8
        if target + 8 * words > self.end:
            raise _Unfollowed()
        self.spend(words if words else 1)
        out = [None] * count
        s.data = target
        s.data_bytes = 8 * words
        s.ptrs = target
        s.ptr_count = count
        if size == SZ_POINTER:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Unfollowed()
            for i in range(count):
                out[i] = self.pointer_value(target + 8 * i, ekind, element[3])
            self.depth -= 1
            return out
        if size == SZ_BIT:
            for i in range(count):
                out[i] = bool((self.buf[target + i // 8] >> (i % 8)) & 1)
            return out
        cdef const uint8_t *at_ = self.buf + target
        cdef float f
        cdef double d
        cdef int32_t i32
        cdef int64_t i64
        if ekind == K_FLOAT32:  # the common lists, without a call per element
            for i in range(count):
                memcpy(&f, at_ + 4 * i, 4)
                out[i] = <double>f
        elif ekind == K_FLOAT64:
            for i in range(count):
                memcpy(&d, at_ + 8 * i, 8)
                out[i] = d
        elif ekind == K_INT32:
            for i in range(count):
                memcpy(&i32, at_ + 4 * i, 4)
                out[i] = i32
        elif ekind == K_INT64:
            for i in range(count):
                memcpy(&i64, at_ + 8 * i, 8)
                out[i] = i64
        else:
            for i in range(count):
                out[i] = self.primitive(s, ekind, i, 0, element[3])
        return out


def read_member(const uint8_t[::1] message, tuple member):
    """The converted value of a union member of the root struct in ``message`` (one
    framed message), or FALLBACK when pycapnp should read this message. ``member``:
    ``(discriminant_offset, discriminant, field)`` (capnp_types.member_plan): a message
    whose root union holds another member is handed back too, as pycapnp fails on it."""
    cdef Py_ssize_t n = message.shape[0]
    cdef uint32_t words
    cdef _Walk walk
    cdef Struct root
    if n < 16 or message[0] != 0 or message[1] != 0 or message[2] != 0 or message[3] != 0:
        return FALLBACK  # not exactly one segment
    words = message[4] | (message[5] << 8) | (message[6] << 16) | (<uint32_t>message[7] << 24)
    if 8 + 8 * <Py_ssize_t>words != n:
        return FALLBACK
    walk = _Walk()
    walk.buf = &message[0]
    walk.start = 8
    walk.end = n
    walk.budget = 8 * <Py_ssize_t>words
    walk.depth = 0
    try:
        root = walk.struct_at(8)
        if walk.raw_bits(root, 2 * <Py_ssize_t>member[0], 2) != <uint16_t>member[1]:
            return FALLBACK
        return walk.read_field(root, <tuple>member[2])
    except _Unfollowed:
        return FALLBACK
