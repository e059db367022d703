# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# Cap'n Proto's wire format as msgq's compiled readers walk it, in one place: the kind
# codes of fields and list elements, the list element size codes, the little-endian word
# loads, and the decoding of struct and list pointers with their bounds checks. Two
# readers cimport it: the typed reader (schemas/_typed_reader.pyx: Spark's typed columns,
# SubMaster's payload views) and the MCAP export's JSON writer (msgq/viz/_json_writer.pyx).
# Declarations and inline functions only: nothing here is a module at run time.
#
# The bytes come from files: untrusted. Every function here that locates something checks
# it against the segment it is told, ``[seg_start, seg_end)`` in bytes of the message, and
# answers -1 for anything that does not lie inside; what a -1 means (the message goes to
# pycapnp), the word budgets, the depth limits and far pointers stay with each reader,
# whose caps differ.

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

# Kinds of fields, list elements and values (the typed reader's layouts and the JSON
# writer's programs use the same numbers; reader_layouts.py and json_writer.py build
# them through the readers' Python names).
cdef enum:
    KIND_BOOL = 0
    KIND_INT8 = 1
    KIND_INT16 = 2
    KIND_INT32 = 3
    KIND_INT64 = 4
    KIND_UINT8 = 5
    KIND_UINT16 = 6
    KIND_UINT32 = 7
    KIND_UINT64 = 8
    KIND_FLOAT32 = 9
    KIND_FLOAT64 = 10
    KIND_TEXT = 11
    KIND_DATA = 12
    KIND_ENUM = 13
    KIND_LIST = 14
    KIND_STRUCT = 15
    KIND_GROUP = 16
    KIND_VOID = 17  # JSON writer: null
    KIND_NULL = 18  # JSON writer: AnyPointer, interface: null, nothing read
    KIND_OTHER = 19  # JSON writer: a generic's parameter, not followed

# List element size codes (bits 32-34 of a list pointer).
cdef enum:
    SZ_VOID = 0
    SZ_BIT = 1
    SZ_BYTE = 2
    SZ_TWO = 3
    SZ_FOUR = 4
    SZ_EIGHT = 5
    SZ_POINTER = 6
    SZ_COMPOSITE = 7


# The forms of a number read_number decodes.
cdef enum:
    NUMBER_SIGNED = 0
    NUMBER_UNSIGNED = 1  # enums too
    NUMBER_FLOAT = 2


cdef struct Number:
    int form  # which of the three holds it
    int64_t as_int
    uint64_t as_uint
    double as_float


cdef struct Struct:
    Py_ssize_t data  # byte offset of the data section
    Py_ssize_t data_bytes
    Py_ssize_t ptrs  # byte offset of the pointer section
    Py_ssize_t ptr_count
    Py_ssize_t seg_start  # the segment it lies in (its pointers are relative to it)
    Py_ssize_t seg_end


cdef struct Composite:
    Py_ssize_t first  # byte offset of the first element
    Py_ssize_t count
    Py_ssize_t step  # bytes per element
    Py_ssize_t data_bytes
    Py_ssize_t ptr_count


cdef inline Py_ssize_t load32(const uint8_t *p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return v


cdef inline uint64_t load64(const uint8_t *p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v


cdef inline int element_size(int kind) noexcept nogil:
    """The list element size code of a list of ``kind`` elements; -1 for kinds that no
    list of a schema's type holds as such (void, null, other, group)."""
    if kind == KIND_BOOL:
        return SZ_BIT
    if kind == KIND_INT8 or kind == KIND_UINT8:
        return SZ_BYTE
    if kind == KIND_INT16 or kind == KIND_UINT16 or kind == KIND_ENUM:
        return SZ_TWO
    if kind == KIND_INT32 or kind == KIND_UINT32 or kind == KIND_FLOAT32:
        return SZ_FOUR
    if kind == KIND_INT64 or kind == KIND_UINT64 or kind == KIND_FLOAT64:
        return SZ_EIGHT
    if kind == KIND_STRUCT:
        return SZ_COMPOSITE
    if kind == KIND_TEXT or kind == KIND_DATA or kind == KIND_LIST:
        return SZ_POINTER
    return -1


cdef inline Py_ssize_t pointer_target(Py_ssize_t at, uint64_t w) noexcept nogil:
    """Where the struct or list pointer ``w`` at byte ``at`` points: the word after it
    plus its signed offset in words (not checked: the caller checks what lies there)."""
    return at + 8 + 8 * <Py_ssize_t>(<int32_t>(<uint32_t>w) >> 2)


cdef inline int list_size(uint64_t w) noexcept nogil:
    """The element size code of the list pointer ``w``."""
    return (w >> 32) & 7


cdef inline Py_ssize_t list_count(uint64_t w) noexcept nogil:
    """The element count of the list pointer ``w`` (a composite list's: its words after
    the tag)."""
    return <Py_ssize_t>(w >> 35)


cdef inline void empty_struct(Struct *s, Py_ssize_t at, Py_ssize_t seg_start,
                              Py_ssize_t seg_end) noexcept nogil:
    """``s``: a struct without data or pointers (a null pointer's: every field reads as
    its default)."""
    s.data = s.ptrs = at
    s.data_bytes = s.ptr_count = 0
    s.seg_start = seg_start
    s.seg_end = seg_end


cdef inline Py_ssize_t struct_in(uint64_t tag, Py_ssize_t target, Py_ssize_t seg_start,
                                 Py_ssize_t seg_end, Struct *s) noexcept nogil:
    """``s``: the struct the struct pointer ``tag`` describes at byte ``target`` of the
    segment. Returns the words a read of it is charged (its size, at least one), or -1
    for a tag that is not a struct pointer or a struct not inside the segment (``s`` is
    then left as it was)."""
    cdef Py_ssize_t dw, pw
    if (tag & 3) != 0:
        return -1
    dw = (tag >> 32) & 0xFFFF
    pw = (tag >> 48) & 0xFFFF
    if target < seg_start or target + 8 * (dw + pw) > seg_end:
        return -1
    s.data = target
    s.data_bytes = 8 * dw
    s.ptrs = target + 8 * dw
    s.ptr_count = pw
    s.seg_start = seg_start
    s.seg_end = seg_end
    return dw + pw if dw + pw > 0 else 1


cdef inline Py_ssize_t list_words(int size, Py_ssize_t count) noexcept nogil:
    """The words ``count`` elements of size code ``size`` take (not composite: that
    list's pointer gives its words)."""
    if size == SZ_VOID:
        return 0
    if size == SZ_BIT:
        return (count + 63) // 64
    if size == SZ_POINTER:
        return count
    return (count * (1 << (size - 2)) + 7) // 8  # 1, 2, 4, 8 bytes


cdef inline Py_ssize_t composite_in(const uint8_t *buf, Py_ssize_t target, Py_ssize_t words,
                                    Py_ssize_t seg_start, Py_ssize_t seg_end,
                                    Composite *c) noexcept nogil:
    """``c``: the list of structs whose tag lies at byte ``target`` of the segment, with
    ``words`` words after the tag (the list pointer's count). Returns the words a read of
    it is charged, or -1 for a list not inside the segment, a tag that is not a struct
    tag or elements that do not fit in ``words``. A list of zero-sized structs claims any
    count in no bytes: its elements are charged one word each (as capnp's amplified reads
    are), so that a few bytes cannot make millions of values."""
    cdef uint64_t tag
    cdef Py_ssize_t count, dw, pw
    if target < seg_start or target + 8 + 8 * words > seg_end:
        return -1
    tag = load64(buf + target)
    if (tag & 3) != 0:
        return -1
    count = <Py_ssize_t>((tag >> 2) & 0x3FFFFFFF)
    dw = (tag >> 32) & 0xFFFF
    pw = (tag >> 48) & 0xFFFF
    if count * (dw + pw) > words:
        return -1
    c.first = target + 8
    c.count = count
    c.step = 8 * (dw + pw)
    c.data_bytes = 8 * dw
    c.ptr_count = pw
    return (count if count > words else words) + 1


cdef inline Py_ssize_t blob_in(const uint8_t *buf, uint64_t w, Py_ssize_t target,
                               Py_ssize_t seg_end, bint text) noexcept nogil:
    """The length of the Data (``text`` false) or Text (without its NUL) that the list
    pointer ``w`` says lies at byte ``target`` (at or after the segment's start); -1 for
    another element size than bytes, bytes past the segment or a Text without its NUL."""
    cdef Py_ssize_t count = list_count(w)
    if list_size(w) != SZ_BYTE or target + count > seg_end:
        return -1
    if not text:
        return count
    if count == 0 or buf[target + count - 1] != 0:
        return -1
    return count - 1


cdef inline uint64_t data_bits(const uint8_t *buf, const Struct *s, Py_ssize_t byte,
                               int width) noexcept nogil:
    """``width`` bytes at ``byte`` of the data section of ``s``, zero beyond it (an older
    writer's smaller struct: the field's default)."""
    cdef uint64_t v = 0
    if byte + width <= s.data_bytes:
        memcpy(&v, buf + s.data + byte, width)
    return v


cdef inline uint64_t data_bit(const uint8_t *buf, const Struct *s, Py_ssize_t bit) noexcept nogil:
    """Bit ``bit`` of the data section of ``s``, zero beyond it."""
    if bit // 8 < s.data_bytes:
        return (buf[s.data + bit // 8] >> (bit % 8)) & 1
    return 0


cdef inline void read_number(const uint8_t *buf, const Struct *s, int kind, Py_ssize_t where,
                             uint64_t default, Number *n) noexcept nogil:
    """``n``: the value of the field of ``kind`` (an integer, a float or an enum; not a
    bool) at ``where`` (in units of its size) of the data section of ``s``: the bits
    stored, XORed with its ``default``'s bits (a field past an older writer's data
    section reads as its default); a float32 widened to a double."""
    cdef uint64_t raw
    cdef uint32_t raw32
    cdef float f
    if kind == KIND_INT8 or kind == KIND_UINT8:
        raw = data_bits(buf, s, where, 1) ^ default
        if kind == KIND_INT8:
            n.form = NUMBER_SIGNED
            n.as_int = <int8_t>raw
        else:
            n.form = NUMBER_UNSIGNED
            n.as_uint = <uint8_t>raw
    elif kind == KIND_INT16 or kind == KIND_UINT16 or kind == KIND_ENUM:
        raw = data_bits(buf, s, 2 * where, 2) ^ default
        if kind == KIND_INT16:
            n.form = NUMBER_SIGNED
            n.as_int = <int16_t>raw
        else:
            n.form = NUMBER_UNSIGNED
            n.as_uint = <uint16_t>raw
    elif kind == KIND_INT32 or kind == KIND_UINT32 or kind == KIND_FLOAT32:
        raw32 = <uint32_t>(data_bits(buf, s, 4 * where, 4) ^ default)
        if kind == KIND_FLOAT32:
            memcpy(&f, &raw32, 4)
            n.form = NUMBER_FLOAT
            n.as_float = <double>f
        elif kind == KIND_INT32:
            n.form = NUMBER_SIGNED
            n.as_int = <int32_t>raw32
        else:
            n.form = NUMBER_UNSIGNED
            n.as_uint = raw32
    else:
        raw = data_bits(buf, s, 8 * where, 8) ^ default
        if kind == KIND_FLOAT64:
            n.form = NUMBER_FLOAT
            memcpy(&n.as_float, &raw, 8)
        elif kind == KIND_INT64:
            n.form = NUMBER_SIGNED
            n.as_int = <int64_t>raw
        else:
            n.form = NUMBER_UNSIGNED
            n.as_uint = raw
