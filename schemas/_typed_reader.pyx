# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The typed reader: fields read straight from a Cap'n Proto message's bytes by following
the encoding with a layout built from the schema, instead of through pycapnp one attribute
at a time (its writing twin, the Event builder that new_message returns, is
schemas/_event_builder.pyx). Two users of the reader: Spark's typed columns (:func:`read_member`:
the values a union member of the root struct converts to, capnp_types.py's rules) and
SubMaster's payload views
(:func:`view_member`: a :class:`StructView` that reads each field when asked, and hands
anything it does not follow to a pycapnp reader of the same struct). Spark's typed
columns are also read a batch of messages at a time, straight into Arrow's buffers
(:func:`read_member_arrow`: the same walk, appending values where read_member makes
objects; :class:`MemberColumn`: one array from the messages of many buffers, which the
lake's build decodes with).

The bytes come from files: untrusted. Every pointer is checked against the segment, the
words read are budgeted (8 times the message, as a traversal limit; a list of
zero-sized structs is charged per element) and nesting is bounded. Anything this reader
does not follow — several segments, far pointers, a list encoded with another element
size than its type's, an unknown union member, text that is not UTF-8 with its NUL, a
root union holding another member, a budget or depth exceeded — makes ``read_member``
return FALLBACK,
and the caller converts that message with pycapnp as before (same values, same errors).
So the result is pycapnp's for every message, only faster for the common ones. The wire
format (kind and element size codes, pointer decoding, bounds checks) is
schemas/_capnp_wire.pxd's, which the MCAP export's JSON writer reads too.

Layouts are tuples (reader_layouts.py places fields; capnp_types.py builds Spark's):
field ``(kind, where, default, extra)``, struct ``(fields, union)`` — or, for views,
``(fields, None, names)``: the fields a view reads by name, union members left out —, union
``(discriminant_offset, {discriminant: (name, index or -1, field or None)}, count)``;
:func:`compile_member` turns a member's into typed objects once (per worker process), so
that reading a field costs C struct accesses, not tuple lookups and conversions.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memset
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject_GenericGetAttr
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8

# The wire format, shared with the MCAP export's JSON writer: Cython finds it from the
# source tree's root (the runtime package msgq.schemas is setup.py's mapping of schemas/).
from schemas._capnp_wire cimport *

# Field and element kinds: schemas/_capnp_wire.pxd's (capnp_types.py builds layouts with
# the K_ names).
K_BOOL = KIND_BOOL
K_INT8 = KIND_INT8
K_INT16 = KIND_INT16
K_INT32 = KIND_INT32
K_INT64 = KIND_INT64
K_UINT8 = KIND_UINT8
K_UINT16 = KIND_UINT16
K_UINT32 = KIND_UINT32
K_UINT64 = KIND_UINT64
K_FLOAT32 = KIND_FLOAT32
K_FLOAT64 = KIND_FLOAT64
K_TEXT = KIND_TEXT
K_DATA = KIND_DATA
K_ENUM = KIND_ENUM
K_LIST = KIND_LIST
K_STRUCT = KIND_STRUCT
K_GROUP = KIND_GROUP
K_VOID = KIND_VOID

#: What read_member returns for a message it leaves to pycapnp.
FALLBACK = object()

cdef int MAX_DEPTH = 64


cdef inline Py_ssize_t framed_words(const uint8_t *message, Py_ssize_t n) noexcept nogil:
    """The words of the segment of the ``n`` bytes at ``message`` when they are exactly
    one framed message of one segment; -1 otherwise (other framings: pycapnp's)."""
    cdef uint64_t w
    if n < 16:
        return -1
    w = load64(message)
    if (w & <uint64_t>0xFFFFFFFF) != 0 or 8 + 8 * <Py_ssize_t>(w >> 32) != n:
        return -1
    return <Py_ssize_t>(w >> 32)


class _Unfollowed(Exception):
    """A message this reader leaves to pycapnp."""


@cython.no_gc  # no cycle goes through a value (a number and a name)
cdef class EnumValue:
    """An enum value as a view reads it, behaving as pycapnp's ``_DynamicEnum``: ``raw``
    (the number), ``str()`` the enumerant's name (RuntimeError for a number the schema
    does not know, as pycapnp), compared with a ``str`` by name and with anything else by
    number, hashed by name."""
    cdef readonly int raw
    cdef object name

    @staticmethod
    cdef EnumValue _of(int raw, object name):
        cdef EnumValue value = EnumValue.__new__(EnumValue)
        value.raw = raw
        value.name = name
        return value

    cpdef _as_str(self):
        if self.name is None:
            raise RuntimeError("Member was null.")
        return self.name

    def __str__(self):
        return self._as_str()

    def __repr__(self):
        return "<%s enum>" % self._as_str()

    def __richcmp__(EnumValue self, right, int op):
        left = self._as_str() if isinstance(right, str) else self.raw
        if op == 2:
            return left == right
        if op == 3:
            return left != right
        if op == 0:
            return left < right
        if op == 1:
            return left <= right
        if op == 4:
            return left > right
        return left >= right

    def __hash__(self):
        return hash(self._as_str())


cdef class Field:
    """A compiled field layout (or list element layout)."""
    cdef int kind
    cdef Py_ssize_t where  # data offset in units of the value's size, or pointer index
    cdef uint64_t default  # the default's bits (XORed with what is stored)
    cdef object names  # enum: {number: name}
    cdef dict enum_values  # enum: {number: EnumValue}, what views return
    cdef Field element  # list: its elements
    cdef StructLayout struct_  # struct, group


cdef class Member:
    """A compiled union member entry: name, position among the members (-1: no column)."""
    cdef object name
    cdef Py_ssize_t at
    cdef Field field


cdef class StructLayout:
    cdef tuple fields  # of Field, the non-union fields in order
    cdef Py_ssize_t n
    cdef bint has_union
    cdef Py_ssize_t discriminant_offset
    cdef dict members  # discriminant -> Member
    cdef Py_ssize_t count
    cdef dict by_name  # views: field name -> Field


cdef Field _compile_field(tuple layout):
    cdef Field f = Field.__new__(Field)
    f.kind = layout[0]
    f.where = layout[1]
    f.default = layout[2]
    extra = layout[3]
    if f.kind == KIND_ENUM:
        f.names = extra
        f.enum_values = {number: EnumValue._of(number, name) for number, name in extra.items()}
    elif f.kind == KIND_LIST:
        f.element = _compile_field(extra)
    elif f.kind == KIND_STRUCT or f.kind == KIND_GROUP:
        f.struct_ = _compile_struct(extra)
    return f


cdef StructLayout _compile_struct(tuple layout):
    cdef StructLayout s = StructLayout.__new__(StructLayout)
    cdef Member m
    s.fields = tuple(_compile_field(f) for f in layout[0])
    s.n = len(s.fields)
    union = layout[1]
    s.has_union = union is not None
    s.members = {}
    s.count = 0
    s.by_name = dict(zip(layout[2], s.fields)) if len(layout) > 2 else {}
    if s.has_union:
        s.discriminant_offset = union[0]
        s.count = union[2]
        for discriminant, (name, at, field) in union[1].items():
            m = Member.__new__(Member)
            m.name = name
            m.at = at
            m.field = None if field is None else _compile_field(field)
            s.members[discriminant] = m
    return s


cdef class CompiledMember:
    """A union member of the root struct, ready for :func:`read_member`."""
    cdef Py_ssize_t discriminant_offset
    cdef uint16_t discriminant
    cdef Field field
    cdef dict columns  # read_member_arrow: Arrow type -> its empty columns, checked once


def compile_member(tuple member):
    """``(discriminant_offset, discriminant, field layout)`` (capnp_types.member_plan)
    compiled for :func:`read_member`."""
    cdef CompiledMember c = CompiledMember.__new__(CompiledMember)
    c.discriminant_offset = member[0]
    c.discriminant = member[1]
    c.field = _compile_field(member[2])
    return c


# --- columns: the same walk, values appended to Arrow's buffers ---------------------------


cdef struct Buf:
    char *data
    Py_ssize_t size  # bytes in use
    Py_ssize_t cap
    Py_ssize_t mark  # the size before the message being read (rolled back to on FALLBACK)


cdef char *buf_grow(Buf *b, Py_ssize_t n) except NULL:
    """:func:`buf_add` when ``b`` lacks room (or has no allocation yet)."""
    cdef Py_ssize_t need = b.size + n, cap
    cdef char *p
    cap = 2 * b.cap if b.cap else 256
    while cap < need:
        cap *= 2
    p = <char *>realloc(b.data, cap)
    if p == NULL:
        raise MemoryError()
    b.data = p
    b.cap = cap
    p = b.data + b.size
    b.size = need
    return p


cdef inline char *buf_add(Buf *b, Py_ssize_t n) except NULL:
    """``n`` more bytes at the end of ``b`` (not initialised). Inlined where values are
    appended: the common case is one comparison; growing is :func:`buf_grow`'s."""
    cdef Py_ssize_t need = b.size + n
    cdef char *p
    if need > b.cap or b.data == NULL:  # allocated even for no bytes: NULL is the error
        return buf_grow(b, n)
    p = b.data + b.size
    b.size = need
    return p


cdef inline bint utf8_valid(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    """Whether the ``n`` bytes at ``p`` are well-formed UTF-8 (what Python's strict
    decoder takes: no overlong forms, no surrogates, nothing past U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    while i < n:
        while i + 8 <= n and (load64(p + i) & <uint64_t>0x8080808080808080) == 0:
            i += 8
        if i >= n:
            break
        c = p[i]
        if c < 0x80:
            i += 1
        elif c < 0xC2:
            return False
        elif c < 0xE0:
            if i + 1 >= n or (p[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = p[i + 1]
            if (c1 & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 >= 0xA0):
                return False  # overlong, or a surrogate
            i += 3
        elif c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = p[i + 1]
            if (c1 & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80 or (p[i + 3] & 0xC0) != 0x80:
                return False
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 >= 0x90):
                return False  # overlong, or past U+10FFFF
            i += 4
        else:
            return False
    return True


cdef inline int value_width(int kind) noexcept nogil:
    """Bytes per value of a column of ``kind`` as Arrow holds it (capnp_types.py's
    types: unsigned integers widened, UInt64 a decimal128; enums: their numbers)."""
    if kind == KIND_BOOL or kind == KIND_INT8:
        return 1
    if kind == KIND_INT16 or kind == KIND_UINT8 or kind == KIND_ENUM:
        return 2
    if kind == KIND_INT32 or kind == KIND_UINT16 or kind == KIND_FLOAT32:
        return 4
    if kind == KIND_INT64 or kind == KIND_UINT32 or kind == KIND_FLOAT64:
        return 8
    if kind == KIND_UINT64:
        return 16
    return 0


cdef inline void store_number(char *p, int kind, const Number *n) noexcept nogil:
    """The number ``n`` of a field of ``kind`` at ``p``, as its column holds it."""
    if kind == KIND_FLOAT64:
        (<double *>p)[0] = n.as_float
    elif kind == KIND_FLOAT32:
        (<float *>p)[0] = <float>n.as_float  # widened from a float: exact
    elif kind == KIND_INT8:
        (<int8_t *>p)[0] = <int8_t>n.as_int
    elif kind == KIND_INT16:
        (<int16_t *>p)[0] = <int16_t>n.as_int
    elif kind == KIND_INT32:
        (<int32_t *>p)[0] = <int32_t>n.as_int
    elif kind == KIND_INT64:
        (<int64_t *>p)[0] = n.as_int
    elif kind == KIND_UINT8 or kind == KIND_ENUM:
        (<uint16_t *>p)[0] = <uint16_t>n.as_uint
    elif kind == KIND_UINT16:
        (<int32_t *>p)[0] = <int32_t>n.as_uint
    elif kind == KIND_UINT32:
        (<int64_t *>p)[0] = <int64_t>n.as_uint
    else:  # UInt64: a decimal128, little-endian, never negative
        (<uint64_t *>p)[0] = n.as_uint
        (<uint64_t *>p)[1] = 0


cdef inline int number_bytes(int kind) noexcept nogil:
    """Bytes a number field of ``kind`` takes in a data section (read_number's widths:
    not a bool's bit); 0 for kinds that are no number."""
    if kind == KIND_INT8 or kind == KIND_UINT8:
        return 1
    if kind == KIND_INT16 or kind == KIND_UINT16 or kind == KIND_ENUM:
        return 2
    if kind == KIND_INT32 or kind == KIND_UINT32 or kind == KIND_FLOAT32:
        return 4
    if kind == KIND_INT64 or kind == KIND_UINT64 or kind == KIND_FLOAT64:
        return 8
    return 0


cdef inline void store_raw(char *p, int kind, uint64_t raw) noexcept nogil:
    """store_number of what read_number makes of ``raw`` (a field's stored bits, XORed
    with its default): the same value, without the Number between them."""
    cdef uint32_t raw32 = <uint32_t>raw
    cdef float f
    if kind == KIND_FLOAT32:
        memcpy(&f, &raw32, 4)
        (<float *>p)[0] = <float>(<double>f)  # read_number widens, store_number narrows
    elif kind == KIND_FLOAT64:
        memcpy(p, &raw, 8)
    elif kind == KIND_INT8:
        (<int8_t *>p)[0] = <int8_t>raw
    elif kind == KIND_INT16:
        (<int16_t *>p)[0] = <int16_t>raw
    elif kind == KIND_INT32:
        (<int32_t *>p)[0] = <int32_t>raw32
    elif kind == KIND_INT64:
        (<int64_t *>p)[0] = <int64_t>raw
    elif kind == KIND_UINT8 or kind == KIND_ENUM or kind == KIND_UINT16 or kind == KIND_UINT32:
        if kind == KIND_UINT8:
            (<uint16_t *>p)[0] = <uint8_t>raw
        elif kind == KIND_ENUM:
            (<uint16_t *>p)[0] = <uint16_t>raw
        elif kind == KIND_UINT16:
            (<int32_t *>p)[0] = <uint16_t>raw
        else:
            (<int64_t *>p)[0] = raw32
    else:  # UInt64: a decimal128, little-endian, never negative
        (<uint64_t *>p)[0] = raw
        (<uint64_t *>p)[1] = 0


cdef void copy_numbers(const uint8_t *src, Py_ssize_t step, Py_ssize_t count, int kind,
                       int width, uint64_t default, char *out, int out_width) noexcept nogil:
    """``count`` number fields of ``kind`` (``width`` bytes each, ``step`` bytes apart
    from ``src``: one field of a list's structs) stored at ``out`` as their column holds
    them: store_raw of each, XORed with ``default``; the common kinds a loop each."""
    cdef Py_ssize_t j
    cdef uint32_t u32
    cdef uint64_t u64
    cdef float f
    if kind == KIND_FLOAT32:
        for j in range(count):
            memcpy(&u32, src + j * step, 4)
            u32 ^= <uint32_t>default
            memcpy(&f, &u32, 4)
            (<float *>out)[j] = <float>(<double>f)  # as store_raw
    elif kind == KIND_UINT32:
        for j in range(count):
            memcpy(&u32, src + j * step, 4)
            (<int64_t *>out)[j] = u32 ^ <uint32_t>default
    elif kind == KIND_UINT8:
        for j in range(count):
            (<uint16_t *>out)[j] = <uint8_t>(src[j * step] ^ default)
    elif kind == KIND_UINT64:
        for j in range(count):
            memcpy(&u64, src + j * step, 8)
            (<uint64_t *>out)[2 * j] = u64 ^ default
            (<uint64_t *>out)[2 * j + 1] = 0
    elif kind == KIND_INT64 or kind == KIND_FLOAT64:
        for j in range(count):
            memcpy(&u64, src + j * step, 8)
            u64 ^= default
            memcpy(out + 8 * j, &u64, 8)
    else:
        for j in range(count):
            u64 = 0
            memcpy(&u64, src + j * step, width)
            store_raw(out + j * out_width, kind, u64 ^ default)


@cython.final  # direct calls (no vtable): its appends inline into the walk
cdef class _Column:
    """One Arrow array being built from a field's values, message after message: its
    values (fixed-width values, or the bytes of text and data), its offsets (text, data,
    lists), its validity (one byte per value, made bits at the end; only a column that
    can hold nulls: a union member's, or inside one) and, for a struct, its children (the
    fields, then ``which`` and the union's members: capnp_types.py's order), for a list
    its elements. Enums and ``which`` hold their numbers and become names at the end."""
    cdef int kind  # the field's kind (KIND_GROUP: a struct too)
    cdef int width  # bytes per value in ``values``
    cdef bint nullable
    cdef Buf values, offsets, valid
    cdef Py_ssize_t length, nulls, mark_length, mark_nulls
    cdef tuple children
    cdef _Column element
    cdef object arrow_type
    cdef dict names  # enum, which: number -> name
    cdef dict tables  # enum, which: n -> Arrow array of the names of 0..n-1 (shared by the
    # copies of a checked column: made once per worker process)

    def __dealloc__(self):
        free(self.values.data)
        free(self.offsets.data)
        free(self.valid.data)

    cdef inline int end_value(self, bint valid) except -1:
        """Closes the value just appended (its offset, its validity)."""
        cdef Py_ssize_t end
        if self.kind == KIND_TEXT or self.kind == KIND_DATA or self.kind == KIND_LIST:
            end = self.values.size if self.kind != KIND_LIST else self.element.length
            if end > 0x7FFFFFFF:
                raise ValueError(f"{end} values in one Arrow array: over its 32-bit offsets")
            (<int32_t *>buf_add(&self.offsets, 4))[0] = <int32_t>end
        if self.nullable:
            buf_add(&self.valid, 1)[0] = valid
        self.length += 1
        return 0

    cdef int add_null(self) except -1:
        cdef _Column child
        if self.width:
            memset(buf_add(&self.values, self.width), 0, self.width)
        if self.kind == KIND_STRUCT or self.kind == KIND_GROUP:
            for child in self.children:
                child.add_null()
        self.nulls += 1
        return self.end_value(False)

    cdef inline int add_number(self, const Number *n) except -1:
        store_number(buf_add(&self.values, self.width), self.kind, n)
        return self.end_value(True)

    cdef int add_bytes(self, const uint8_t *p, Py_ssize_t n) except -1:
        cdef char *out = buf_add(&self.values, n)
        cdef Py_ssize_t k
        if n <= 16:  # most text and data are short: no call to the library's copy
            for k in range(n):
                out[k] = p[k]
        else:
            memcpy(out, p, n)
        return self.end_value(True)

    cdef void save(self) noexcept:
        self.values.mark = self.values.size
        self.offsets.mark = self.offsets.size
        self.valid.mark = self.valid.size
        self.mark_length = self.length
        self.mark_nulls = self.nulls

    cdef void restore(self) noexcept:
        self.values.size = self.values.mark
        self.offsets.size = self.offsets.mark
        self.valid.size = self.valid.mark
        self.length = self.mark_length
        self.nulls = self.mark_nulls

    cdef object finish(self, object pa, object np):
        """The Arrow array of the values appended."""
        cdef _Column child
        cdef int kind = self.kind
        validity = None
        if self.nulls:
            validity = pa.py_buffer(np.packbits(
                np.frombuffer(_owned(&self.valid), np.uint8), bitorder="little"))
        if kind == KIND_STRUCT or kind == KIND_GROUP:
            return pa.Array.from_buffers(self.arrow_type, self.length, [validity], self.nulls,
                                         children=[child.finish(pa, np)
                                                   for child in self.children])
        if kind == KIND_LIST:
            return pa.Array.from_buffers(self.arrow_type, self.length,
                                         [validity, pa.py_buffer(_owned(&self.offsets))],
                                         self.nulls, children=[self.element.finish(pa, np)])
        if kind == KIND_TEXT or kind == KIND_DATA:
            return pa.Array.from_buffers(self.arrow_type, self.length,
                                         [validity, pa.py_buffer(_owned(&self.offsets)),
                                          pa.py_buffer(_owned(&self.values))], self.nulls)
        if kind == KIND_ENUM:
            return self.finish_names(pa, np, validity)
        values = pa.py_buffer(_owned(&self.values))
        if kind == KIND_BOOL:
            values = pa.py_buffer(np.packbits(np.frombuffer(values, np.uint8),
                                              bitorder="little"))
        return pa.Array.from_buffers(self.arrow_type, self.length, [validity, values],
                                     self.nulls)

    cdef object finish_names(self, object pa, object np, object validity):
        """An enum's (or ``which``'s) names: a table of every number up to the largest
        met (a number the schema does not know: itself, as text), taken by number; the
        numbers met, when they are few and far apart."""
        numbers = np.frombuffer(_owned(&self.values), np.uint16)
        top = int(numbers.max()) if len(numbers) else 0
        names = self.names
        if top < 4 * len(names) + 64:
            codes = pa.Array.from_buffers(pa.uint16(), self.length,
                                          [validity, pa.py_buffer(numbers)], self.nulls)
            table = self.tables.get(top + 1)
            if table is None:
                table = self.tables[top + 1] = self.names_of(pa, range(top + 1))
        else:
            met, inverse = np.unique(numbers, return_inverse=True)
            codes = pa.Array.from_buffers(pa.int64(), self.length, [
                validity, pa.py_buffer(inverse.astype(np.int64))], self.nulls)
            table = self.names_of(pa, met.tolist())
        return table.take(codes)

    cdef object names_of(self, object pa, object numbers):
        """The Arrow array of the names of ``numbers`` (a number the schema does not
        know: itself, as text)."""
        names = self.names
        return pa.array([names.get(number) or str(number) for number in numbers],
                        type=self.arrow_type)


@cython.final
cdef class _Owned:
    """The memory of a finished column's buffer, handed to Arrow as it is (a read-only
    buffer, ``pa.py_buffer``'s): freed when the last Arrow buffer on it goes, not copied
    into a bytes object first (a copy of every byte decoded, and the pages it touches)."""
    cdef char *data
    cdef Py_ssize_t size

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.size, 1, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __dealloc__(self):
        free(self.data)


cdef object _owned(Buf *b):
    """The bytes in use of ``b``, taken from it (``b`` is left empty, owning nothing);
    ``b""`` when it never held any."""
    cdef _Owned owned
    if b.data == NULL:
        return b""
    owned = _Owned.__new__(_Owned)
    owned.data = b.data
    owned.size = b.size
    b.data = NULL
    b.size = b.cap = b.mark = 0
    return owned


cdef dict _ARROW_KINDS = {}


cdef object _arrow_of_kind(int kind, object pa):
    """The Arrow type a column of ``kind`` has (capnp_types.py's Spark type, as Spark
    makes it Arrow's); None for kinds with children."""
    if not _ARROW_KINDS:
        _ARROW_KINDS.update({
            KIND_BOOL: pa.bool_(), KIND_INT8: pa.int8(), KIND_INT16: pa.int16(),
            KIND_INT32: pa.int32(), KIND_INT64: pa.int64(), KIND_UINT8: pa.int16(),
            KIND_UINT16: pa.int32(), KIND_UINT32: pa.int64(),
            KIND_UINT64: pa.decimal128(20, 0), KIND_FLOAT32: pa.float32(),
            KIND_FLOAT64: pa.float64(), KIND_TEXT: pa.string(), KIND_DATA: pa.binary(),
            KIND_ENUM: pa.string()})
    return _ARROW_KINDS.get(kind)


cdef _Column _new_column(int kind, object arrow_type, bint nullable, list every):
    cdef _Column c = _Column.__new__(_Column)
    c.kind = kind
    c.width = value_width(kind)
    c.nullable = nullable
    c.arrow_type = arrow_type
    every.append(c)
    if kind == KIND_TEXT or kind == KIND_DATA or kind == KIND_LIST:
        (<int32_t *>buf_add(&c.offsets, 4))[0] = 0
    return c


cdef _Column _fresh(_Column empty, list every):
    """A new column like ``empty`` (its kinds and types, its children's), with no value."""
    cdef _Column c = _new_column(empty.kind, empty.arrow_type, empty.nullable, every)
    cdef _Column child
    c.names = empty.names
    c.tables = empty.tables
    if empty.element is not None:
        c.element = _fresh(empty.element, every)
    if empty.children is not None:
        c.children = tuple([_fresh(child, every) for child in empty.children])
    return c


cdef _Column _column_of(Field field, object arrow_type, bint nullable, list every, object pa):
    """The column of ``field``'s values, of ``arrow_type`` (checked against the field's
    layout: a layout and a type from different plans are refused)."""
    cdef _Column c
    cdef StructLayout layout
    cdef Member m
    cdef Py_ssize_t i
    cdef int kind = field.kind
    expected = _arrow_of_kind(kind, pa)
    if expected is not None and arrow_type != expected:
        raise ValueError(f"a field of kind {kind} is Arrow's {expected}, not {arrow_type}")
    c = _new_column(kind, arrow_type, nullable, every)
    if kind == KIND_ENUM:
        c.names = field.names
        c.tables = {}
    elif kind == KIND_LIST:
        if not pa.types.is_list(arrow_type):
            raise ValueError(f"a list is an Arrow list, not {arrow_type}")
        c.element = _column_of(field.element, arrow_type.value_type, False, every, pa)
    elif kind == KIND_STRUCT or kind == KIND_GROUP:
        layout = field.struct_
        if not pa.types.is_struct(arrow_type) or arrow_type.num_fields != \
                layout.n + (1 + layout.count if layout.has_union else 0):
            raise ValueError(f"a struct of {layout.n} fields (and a union of {layout.count})"
                             f" is not Arrow's {arrow_type}")
        children = [_column_of(<Field>layout.fields[i], arrow_type.field(i).type, nullable,
                               every, pa) for i in range(layout.n)]
        if layout.has_union:
            which = _new_column(KIND_ENUM, arrow_type.field(layout.n).type, nullable, every)
            which.names = {d: (<Member>m).name for d, m in layout.members.items()}
            which.tables = {}
            children.append(which)
            members = [None] * layout.count
            for m in layout.members.values():
                if m.at >= 0:
                    members[m.at] = m.field
            for i in range(layout.count):
                children.append(_column_of(<Field>members[i],
                                           arrow_type.field(layout.n + 1 + i).type, True,
                                           every, pa))
        c.children = tuple(children)
    elif expected is None:
        raise ValueError(f"no column for a field of kind {kind}")
    return c


@cython.final  # direct calls (no vtable): the fill methods call each other per value
cdef class _Walk:
    """One message: its segment's bounds, the word budget, the depth."""
    cdef const uint8_t *buf
    cdef Py_ssize_t start, end
    cdef Py_ssize_t budget
    cdef Py_ssize_t limit  # views: the budget each read starts with
    cdef int depth
    cdef bint views  # enums as EnumValue; lists of structs left to pycapnp

    cdef int spend(self, Py_ssize_t words) except -1:
        self.budget -= words
        if self.budget < 0:
            raise _Unfollowed()
        return 0

    cdef int struct_at(self, Py_ssize_t at, Struct *s) except -1:
        """The struct the pointer at byte ``at`` points to (a null pointer: an empty
        struct, so every field reads as its default)."""
        cdef uint64_t w = load64(self.buf + at)
        cdef Py_ssize_t words
        empty_struct(s, at, self.start, self.end)
        if w == 0:
            return 0
        words = struct_in(w, pointer_target(at, w), self.start, self.end, s)
        if words < 0:
            raise _Unfollowed()  # a far pointer, not a struct pointer, or out of bounds
        self.spend(words)
        return 0

    cdef object read_struct(self, const Struct *s, StructLayout layout):
        cdef Py_ssize_t n = layout.n
        cdef Py_ssize_t i, total
        cdef Member member
        cdef object value
        total = n + 1 + layout.count if layout.has_union else n
        out = PyTuple_New(total)
        for i in range(n):
            value = self.read_field(s, <Field>layout.fields[i])
            Py_INCREF(value)
            PyTuple_SET_ITEM(out, i, value)
        if not layout.has_union:
            return out
        member = layout.members.get(
            <uint16_t>data_bits(self.buf, s, 2 * layout.discriminant_offset, 2))
        if member is None:
            raise _Unfollowed()  # a member of a newer schema: pycapnp says what it does
        Py_INCREF(member.name)
        PyTuple_SET_ITEM(out, n, member.name)
        for i in range(layout.count):
            if i == member.at:
                value = self.read_field(s, member.field)
            else:
                value = None
            Py_INCREF(value)
            PyTuple_SET_ITEM(out, n + 1 + i, value)
        return out

    cdef object read_field(self, const Struct *s, Field field):
        cdef int kind = field.kind
        cdef Py_ssize_t where = field.where
        if kind == KIND_BOOL:
            return bool(data_bit(self.buf, s, where) ^ field.default)
        if kind <= KIND_FLOAT64 or kind == KIND_ENUM:
            return self.primitive(s, kind, where, field.default,
                                  field.enum_values if self.views else field.names)
        if kind == KIND_GROUP:
            return self.read_struct(s, field.struct_)
        # pointer fields: where is the pointer index
        if where >= s.ptr_count:
            return self.null_value(field)
        return self.pointer_value(s.ptrs + 8 * where, field)

    cdef object primitive(self, const Struct *s, int kind, Py_ssize_t where,
                          uint64_t default, object names):
        cdef Number n
        read_number(self.buf, s, kind, where, default, &n)
        if kind == KIND_ENUM:
            name = names.get(<uint16_t>n.as_uint)
            if self.views:
                return name if name is not None else EnumValue._of(<uint16_t>n.as_uint, None)
            return name if name is not None else str(<uint16_t>n.as_uint)
        if n.form == NUMBER_SIGNED:
            return n.as_int
        if n.form == NUMBER_UNSIGNED:
            return n.as_uint
        return n.as_float

    cdef object null_value(self, Field field):
        cdef int kind = field.kind
        cdef Struct empty
        if kind == KIND_TEXT:
            return ""
        if kind == KIND_DATA:
            return b""
        if kind == KIND_LIST:
            return []
        empty_struct(&empty, 0, self.start, self.end)
        return self.nested(&empty, field.struct_)  # a struct of defaults

    cdef object nested(self, const Struct *s, StructLayout layout):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Unfollowed()
        value = self.read_struct(s, layout)
        self.depth -= 1
        return value

    cdef object pointer_value(self, Py_ssize_t at, Field field):
        cdef uint64_t w = load64(self.buf + at)
        cdef Struct s
        if w == 0:
            return self.null_value(field)
        if field.kind == KIND_STRUCT:
            self.struct_at(at, &s)
            return self.nested(&s, field.struct_)
        return self.list_at(at, w, field)

    cdef int composite(self, Py_ssize_t at, uint64_t w, Composite *c) except -1:
        """The list of structs the (non-null) list pointer ``w`` at byte ``at`` points
        to, checked: a composite list whose elements lie inside the segment."""
        cdef Py_ssize_t words
        if (w & 3) != 1 or list_size(w) != SZ_COMPOSITE:
            raise _Unfollowed()
        words = composite_in(self.buf, pointer_target(at, w), list_count(w), self.start,
                             self.end, c)
        if words < 0:
            raise _Unfollowed()
        self.spend(words)
        return 0

    cdef Py_ssize_t list_target(self, Py_ssize_t at, uint64_t w) except -1:
        """Where the (non-null) list pointer ``w`` at byte ``at`` points: checked to be a
        list pointer at or after the segment's start (what lies there is checked by
        :meth:`blob`, :meth:`elements` or :meth:`composite`)."""
        cdef Py_ssize_t target
        if (w & 3) != 1:
            raise _Unfollowed()
        target = pointer_target(at, w)
        if target < self.start:
            raise _Unfollowed()
        return target

    cdef Py_ssize_t blob(self, Py_ssize_t target, uint64_t w, bint text) except -1:
        """The length of the Text (without its NUL) or Data the list pointer ``w`` says
        lies at ``target``, checked and charged."""
        cdef Py_ssize_t n = blob_in(self.buf, w, target, self.end, text)
        if n < 0:
            raise _Unfollowed()  # not bytes, past the segment, or text without its NUL
        self.spend((list_count(w) + 7) // 8)
        return n

    cdef Py_ssize_t elements(self, Py_ssize_t target, uint64_t w, Field element) except -1:
        """The count of a list of ``element`` values (not structs) the list pointer ``w``
        says lies at ``target``: checked to be encoded with the element's size and to lie
        in the segment, and charged."""
        cdef int size = list_size(w)
        cdef Py_ssize_t count = list_count(w), words
        if element.kind == KIND_GROUP or size != element_size(element.kind):
            raise _Unfollowed()  # another encoding than the type's: pycapnp converts
        words = list_words(size, count)
        if target + 8 * words > self.end:
            raise _Unfollowed()
        self.spend(words if words else 1)
        return count

    cdef object list_at(self, Py_ssize_t at, uint64_t w, Field field):
        """The value of a list pointer: text, data, or a list of the field's elements."""
        cdef Py_ssize_t target, count, i, n
        cdef int ekind, kind = field.kind
        cdef Field element
        cdef Struct s
        cdef Composite c
        cdef object value
        cdef const uint8_t *p
        cdef float f
        cdef double d
        cdef int32_t i32
        cdef int64_t i64
        target = self.list_target(at, w)
        if kind == KIND_TEXT or kind == KIND_DATA:
            n = self.blob(target, w, kind == KIND_TEXT)
            if kind == KIND_DATA:
                return PyBytes_FromStringAndSize(<const char *>self.buf + target, n)
            try:
                return PyUnicode_DecodeUTF8(<const char *>self.buf + target, n, NULL)
            except UnicodeDecodeError:
                raise _Unfollowed()
        element = field.element
        ekind = element.kind
        if ekind == KIND_STRUCT:
            if self.views:
                raise _Unfollowed()  # views: a StructListView, made by the view itself
            self.composite(at, w, &c)
            out = PyList_New(c.count)
            s.data_bytes = c.data_bytes
            s.ptr_count = c.ptr_count
            s.seg_start = self.start
            s.seg_end = self.end
            for i in range(c.count):
                s.data = c.first + i * c.step
                s.ptrs = s.data + c.data_bytes
                value = self.nested(&s, element.struct_)
                Py_INCREF(value)
                PyList_SET_ITEM(out, i, value)
            return out
        count = self.elements(target, w, element)
        out = PyList_New(count)
        p = self.buf + target
        if element_size(ekind) == SZ_POINTER:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Unfollowed()
            for i in range(count):
                if load64(p + 8 * i) == 0:
                    value = self.null_value(element)
                else:
                    value = self.pointer_value(target + 8 * i, element)
                Py_INCREF(value)
                PyList_SET_ITEM(out, i, value)
            self.depth -= 1
            return out
        empty_struct(&s, target, self.start, self.end)
        s.data_bytes = 8 * list_words(element_size(ekind), count)  # the elements as a data
        # section: primitive() reads them
        for i in range(count):  # the common lists without a call per element
            if ekind == KIND_FLOAT32:
                memcpy(&f, p + 4 * i, 4)
                value = <double>f
            elif ekind == KIND_FLOAT64:
                memcpy(&d, p + 8 * i, 8)
                value = d
            elif ekind == KIND_INT32:
                memcpy(&i32, p + 4 * i, 4)
                value = i32
            elif ekind == KIND_INT64:
                memcpy(&i64, p + 8 * i, 8)
                value = i64
            elif ekind == KIND_BOOL:
                value = bool(data_bit(self.buf, &s, i))
            else:
                value = self.primitive(&s, ekind, i, 0,
                                       element.enum_values if self.views else element.names)
            Py_INCREF(value)
            PyList_SET_ITEM(out, i, value)
        return out


    # -- columns: the walk above, appending to Arrow buffers instead of making objects --

    cdef int fill_struct(self, const Struct *s, StructLayout layout, _Column column) except -1:
        """Appends the struct ``s`` to ``column``: read_struct's walk."""
        cdef Py_ssize_t n = layout.n
        cdef Py_ssize_t i
        cdef uint16_t discriminant
        cdef Member member
        cdef tuple children = column.children
        cdef Number which
        for i in range(n):
            self.fill_field(s, <Field>layout.fields[i], <_Column>children[i])
        if layout.has_union:
            discriminant = <uint16_t>data_bits(self.buf, s, 2 * layout.discriminant_offset, 2)
            member = layout.members.get(discriminant)
            if member is None:
                raise _Unfollowed()  # a member of a newer schema: pycapnp says what it does
            which.as_uint = discriminant
            (<_Column>children[n]).add_number(&which)
            for i in range(layout.count):
                if i == member.at:
                    self.fill_field(s, member.field, <_Column>children[n + 1 + i])
                else:
                    (<_Column>children[n + 1 + i]).add_null()
        return column.end_value(True)

    cdef int fill_elements(self, const Composite *c, StructLayout layout,
                           _Column column) except -1:
        """Appends the ``c.count`` structs of the list ``c`` to ``column``: fill_nested of
        each element, done a field at a time over the elements (each child column gets
        the same values in the same order): a number field inside the elements' data
        section is one loop of loads and stores, with no call per value."""
        cdef Py_ssize_t n = layout.n, count = c.count, step = c.step
        cdef Py_ssize_t i, j, width, byte, at, target, size
        cdef int kind
        cdef uint64_t w
        cdef Field field
        cdef _Column child
        cdef tuple children = column.children
        cdef Struct s
        cdef Number which
        cdef Member member
        cdef uint16_t discriminant
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Unfollowed()
        s.data_bytes = c.data_bytes
        s.ptr_count = c.ptr_count
        s.seg_start = self.start
        s.seg_end = self.end
        for i in range(n):
            field = <Field>layout.fields[i]
            child = <_Column>children[i]
            kind = field.kind
            width = number_bytes(kind)
            byte = field.where * width
            if width and byte + width <= c.data_bytes:
                copy_numbers(self.buf + c.first + byte, step, count, kind, width,
                             field.default, buf_add(&child.values, count * child.width),
                             child.width)
                if child.nullable:
                    memset(buf_add(&child.valid, count), 1, count)
                child.length += count
                continue
            if (kind == KIND_TEXT or kind == KIND_DATA) and field.where < c.ptr_count:
                # fill_field -> fill_pointer -> fill_list of each element, unrolled
                for j in range(count):
                    at = c.first + j * step + c.data_bytes + 8 * field.where
                    w = load64(self.buf + at)
                    if w == 0:
                        child.end_value(True)  # a null pointer: empty text or data
                        continue
                    target = self.list_target(at, w)
                    size = self.blob(target, w, kind == KIND_TEXT)
                    if kind == KIND_TEXT and not utf8_valid(self.buf + target, size):
                        raise _Unfollowed()  # as fill_list
                    child.add_bytes(self.buf + target, size)
                continue
            for j in range(count):
                s.data = c.first + j * step
                s.ptrs = s.data + c.data_bytes
                self.fill_field(&s, field, child)
        for j in range(count):
            if layout.has_union:
                s.data = c.first + j * step
                s.ptrs = s.data + c.data_bytes
                discriminant = <uint16_t>data_bits(self.buf, &s,
                                                   2 * layout.discriminant_offset, 2)
                member = layout.members.get(discriminant)
                if member is None:
                    raise _Unfollowed()  # as fill_struct
                which.as_uint = discriminant
                (<_Column>children[n]).add_number(&which)
                for i in range(layout.count):
                    if i == member.at:
                        self.fill_field(&s, member.field, <_Column>children[n + 1 + i])
                    else:
                        (<_Column>children[n + 1 + i]).add_null()
            column.end_value(True)
        self.depth -= 1
        return 0

    cdef int fill_field(self, const Struct *s, Field field, _Column column) except -1:
        """Appends the value of ``field`` of ``s`` to ``column``: read_field's walk."""
        cdef int kind = field.kind
        cdef Py_ssize_t where = field.where
        cdef int width
        cdef uint64_t raw = 0
        if kind == KIND_BOOL:
            buf_add(&column.values, 1)[0] = <char>(data_bit(self.buf, s, where) ^ field.default)
            return column.end_value(True)
        if kind <= KIND_FLOAT64 or kind == KIND_ENUM:
            # read_number then store_number, with no Number between them
            width = number_bytes(kind)
            if (where + 1) * width <= s.data_bytes:  # else the default: none stored
                memcpy(&raw, self.buf + s.data + where * width, width)
            store_raw(buf_add(&column.values, column.width), kind, raw ^ field.default)
            return column.end_value(True)
        if kind == KIND_GROUP:
            return self.fill_struct(s, field.struct_, column)
        if where >= s.ptr_count:
            return self.fill_null(field, column)
        return self.fill_pointer(s.ptrs + 8 * where, field, column)

    cdef int fill_null(self, Field field, _Column column) except -1:
        """Appends the value of a null pointer: null_value's."""
        cdef Struct empty
        if field.kind == KIND_STRUCT:
            empty_struct(&empty, 0, self.start, self.end)
            return self.fill_nested(&empty, field.struct_, column)
        return column.end_value(True)  # empty text, data or list

    cdef int fill_nested(self, const Struct *s, StructLayout layout, _Column column) except -1:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Unfollowed()
        self.fill_struct(s, layout, column)
        self.depth -= 1
        return 0

    cdef int fill_pointer(self, Py_ssize_t at, Field field, _Column column) except -1:
        """Appends the value of the pointer at byte ``at``: pointer_value's walk."""
        cdef uint64_t w = load64(self.buf + at)
        cdef Struct s
        if w == 0:
            return self.fill_null(field, column)
        if field.kind == KIND_STRUCT:
            self.struct_at(at, &s)
            return self.fill_nested(&s, field.struct_, column)
        return self.fill_list(at, w, field, column)

    cdef int fill_list(self, Py_ssize_t at, uint64_t w, Field field, _Column column) except -1:
        """Appends the value of a (non-null) list pointer: list_at's walk."""
        cdef Py_ssize_t target, count, i, n
        cdef int kind = field.kind, ekind
        cdef Field element
        cdef _Column elements
        cdef Struct s
        cdef Composite c
        cdef Number number
        cdef char *out
        target = self.list_target(at, w)
        if kind == KIND_TEXT or kind == KIND_DATA:
            n = self.blob(target, w, kind == KIND_TEXT)
            if kind == KIND_TEXT and not utf8_valid(self.buf + target, n):
                raise _Unfollowed()  # pycapnp says what it makes of it
            return column.add_bytes(self.buf + target, n)
        element = field.element
        ekind = element.kind
        elements = column.element
        if ekind == KIND_STRUCT:
            self.composite(at, w, &c)
            if c.count:
                self.fill_elements(&c, element.struct_, elements)
            return column.end_value(True)
        count = self.elements(target, w, element)
        if element_size(ekind) == SZ_POINTER:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Unfollowed()
            for i in range(count):
                if load64(self.buf + target + 8 * i) == 0:
                    self.fill_null(element, elements)
                else:
                    self.fill_pointer(target + 8 * i, element, elements)
            self.depth -= 1
            return column.end_value(True)
        if ekind == KIND_INT8 or ekind == KIND_INT16 or ekind == KIND_INT32 or \
                ekind == KIND_INT64 or ekind == KIND_FLOAT32 or ekind == KIND_FLOAT64 or \
                ekind == KIND_ENUM:
            # stored as the column holds them: the elements' bytes, at once
            memcpy(buf_add(&elements.values, count * elements.width), self.buf + target,
                   count * elements.width)
        else:
            empty_struct(&s, target, self.start, self.end)
            s.data_bytes = 8 * list_words(element_size(ekind), count)  # the elements as
            # a data section: read_number reads them
            out = buf_add(&elements.values, count * elements.width)
            for i in range(count):
                if ekind == KIND_BOOL:
                    out[i] = <char>data_bit(self.buf, &s, i)
                else:
                    read_number(self.buf, &s, ekind, i, 0, &number)
                    store_number(out + i * elements.width, ekind, &number)
        elements.length += count  # elements are never null: no validity
        return column.end_value(True)

def read_member(const uint8_t[::1] message, CompiledMember member not None):
    """The converted value of a union member of the root struct in ``message`` (one
    framed message), or FALLBACK when pycapnp should read this message. ``member``: from
    :func:`compile_member`; a message whose root union holds another member is handed
    back too, as pycapnp fails on it."""
    cdef Py_ssize_t n = message.shape[0]
    cdef Py_ssize_t words
    cdef _Walk walk
    cdef Struct root
    if n < 16:
        return FALLBACK
    words = framed_words(&message[0], n)
    if words < 0:
        return FALLBACK  # not exactly one segment
    walk = _Walk.__new__(_Walk)
    walk.buf = &message[0]
    walk.start = 8
    walk.end = n
    walk.budget = 8 * words
    walk.depth = 0
    try:
        walk.struct_at(8, &root)
        if data_bits(walk.buf, &root, 2 * member.discriminant_offset, 2) != member.discriminant:
            return FALLBACK
        return walk.read_field(&root, member.field)
    except _Unfollowed:
        return FALLBACK


def read_member_arrow(buffer, starts, lengths, CompiledMember member not None, arrow_type):
    """The values of ``member`` in the messages at ``starts``/``lengths`` (byte offsets
    and sizes, framed messages) of ``buffer`` (bytes-like), as one Arrow array of
    ``arrow_type`` (the member's Spark type as Arrow's), and the positions of the
    messages left out of it: those :func:`read_member` hands back (FALLBACK), which the
    caller converts with pycapnp. The array holds exactly what ``pa.array`` makes of
    read_member's values, with no Python object per value: each message is walked as
    read_member walks it (the same checks, budget and depth) and its values appended to
    the array's buffers; a message the walk leaves is rolled back out of them. One
    :class:`MemberColumn` read once."""
    column = MemberColumn(member, arrow_type)
    column.add(buffer, starts, lengths)
    return column.finish()


cdef class MemberColumn:
    """One Arrow array of ``member``'s values (of ``arrow_type``) read from the messages
    of many buffers, one :meth:`add` each, and made once by :meth:`finish`: what
    :func:`read_member_arrow` makes of all those messages as if they lay in one buffer.
    A reader of many small runs of messages (a log's scanner batches, each walked while
    its bytes are fresh in the caches) gets one array, not one per run: no per-run
    arrays to make, concatenate or write apart."""
    cdef CompiledMember member
    cdef _Column column
    cdef tuple columns
    cdef list fallback
    cdef Py_ssize_t added
    cdef bint finished

    def __init__(self, CompiledMember member not None, arrow_type):
        # pyarrow: Spark's (the spark extra), imported by this reader's Spark use only
        import pyarrow as pa
        cdef list every = []
        if member.columns is None:
            member.columns = {}
        empty = member.columns.get(arrow_type)
        if empty is None:  # the type checked against the layout once per member and type
            empty = member.columns[arrow_type] = _column_of(member.field, arrow_type, False,
                                                            [], pa)
        self.member = member
        self.column = _fresh(empty, every)
        self.columns = tuple(every)
        self.fallback = []
        self.added = 0
        self.finished = False

    @property
    def count(self):
        """The messages added so far (values read and positions left out)."""
        return self.added

    def add(self, buffer, starts, lengths):
        """Reads the messages at ``starts``/``lengths`` of ``buffer`` (as
        :func:`read_member_arrow`); returns the positions of those of them left out,
        counted over every message added (as :meth:`finish` gives them all)."""
        # numpy: Spark's (the spark extra), imported by this reader's Spark use only
        import numpy as np
        cdef const int64_t[::1] at = np.ascontiguousarray(starts, dtype=np.int64)
        cdef const int64_t[::1] size = np.ascontiguousarray(lengths, dtype=np.int64)
        cdef const uint8_t[::1] data
        cdef const uint8_t *buf = NULL
        cdef Py_ssize_t total, i, j, a, n, words, saved, count = at.shape[0]
        cdef Py_ssize_t first = self.added, left = len(self.fallback)
        cdef tuple columns = self.columns
        cdef _Walk walk
        if self.finished:
            raise ValueError("the column is finished: make a new MemberColumn")
        if size.shape[0] != count:
            raise ValueError(f"{count} starts but {size.shape[0]} lengths")
        view = memoryview(buffer).cast("B")  # an Arrow buffer's is of signed bytes
        total = len(view)
        if total:
            data = view
            buf = &data[0]
        for i in range(count):  # checked before any is read: a bad call adds nothing
            if at[i] < 0 or size[i] < 0 or at[i] > total - size[i]:
                raise ValueError(f"message {i} ({size[i]} bytes at {at[i]}) is not inside "
                                 f"the buffer's {total} bytes")
        walk = _Walk.__new__(_Walk)
        walk.buf = buf
        # The columns' state is saved once, not before every message: a message the
        # walk leaves (rare: damage, far pointers, ...) rolls every column back to the
        # last save and walks the messages read since then again (they read the same
        # again), then saves anew; so no message is walked more than twice.
        for j in range(len(columns)):
            (<_Column>columns[j]).save()
        saved = 0  # the first message not in the saved state
        for i in range(count):
            a = at[i]
            n = size[i]
            words = framed_words(buf + a, n) if n >= 16 else -1
            if words < 0:
                self.fallback.append(first + i)  # not exactly one segment
                continue
            try:
                self._fill(walk, a, n, words)
            except _Unfollowed:
                for j in range(len(columns)):
                    (<_Column>columns[j]).restore()
                for j in range(saved, i):
                    words = framed_words(buf + at[j], size[j]) if size[j] >= 16 else -1
                    if words >= 0:
                        self._fill(walk, at[j], size[j], words)
                for j in range(len(columns)):
                    (<_Column>columns[j]).save()
                saved = i + 1
                self.fallback.append(first + i)
        self.added = first + count
        return self.fallback[left:]

    cdef int _fill(self, _Walk walk, Py_ssize_t a, Py_ssize_t n, Py_ssize_t words) except -1:
        """Appends the member's value in the message of ``n`` bytes at ``a`` (one framed
        segment of ``words`` words) to the column; _Unfollowed when the walk leaves it."""
        cdef Struct root
        cdef CompiledMember member = self.member
        walk.start = a + 8
        walk.end = a + n
        walk.budget = 8 * words
        walk.depth = 0
        walk.struct_at(a + 8, &root)
        if data_bits(walk.buf, &root, 2 * member.discriminant_offset, 2) != \
                member.discriminant:
            raise _Unfollowed()
        return walk.fill_field(&root, member.field, self.column)

    def finish(self):
        """(the Arrow array of every value read, the positions of the messages left out
        of it, counted over every message added); once."""
        # numpy and pyarrow: Spark's (the spark extra), imported by this reader's Spark
        # use only
        import numpy as np
        import pyarrow as pa
        if self.finished:
            raise ValueError("the column is finished already")
        self.finished = True
        array = self.column.finish(pa, np)
        self.column = None
        self.columns = ()
        return array, self.fallback


# --- views -------------------------------------------------------------------------------


@cython.no_gc  # references point up to the parent and the bytes only: no cycle, no GC cost
cdef class _PycapnpBacked:
    """What both views share: the message, where they sit in it, and the pycapnp reader of
    the same struct or list that answers what the view does not read itself — made once, on
    first need, from the parent's reader (the root's from the message)."""
    cdef object message  # the bytes, kept alive: walk.buf points into them
    cdef _Walk walk
    cdef StructLayout layout
    cdef object parent  # a view, or for the root a callable giving its pycapnp reader
    cdef object name  # the attribute (a list's: the index) of the parent's reader this is
    cdef object reader  # the pycapnp reader, once made
    cdef bint decode_message  # the root: parent(message), not parent(), gives its reader

    cdef object _pycapnp(self):
        if self.reader is None:
            if isinstance(self.parent, StructListView):
                self.reader = (<StructListView>self.parent)._pycapnp()[self.name]
            elif isinstance(self.parent, _PycapnpBacked):
                self.reader = getattr((<_PycapnpBacked>self.parent)._pycapnp(), self.name)
            elif self.decode_message:
                self.reader = self.parent(self.message)
            else:
                self.reader = self.parent()
        return self.reader

    cdef inline void _place(self, object message, _Walk walk, StructLayout layout,
                            object parent, object name):
        """Sets where the view sits: the message, its walker, the layout and the parent."""
        self.message = message
        self.walk = walk
        self.layout = layout
        self.parent = parent
        self.name = name

    def as_pycapnp(self):
        """pycapnp's reader of the same struct or list (``capnp._DynamicStructReader`` /
        ``_DynamicListReader``), for code that needs pycapnp's own object: a view's type
        is its own (``type(v) is v.__class__``), not pycapnp's."""
        return self._pycapnp()

    def __dir__(self):
        return dir(self._pycapnp())

    def __str__(self):
        return str(self._pycapnp())

    def __repr__(self):
        return repr(self._pycapnp())


@cython.no_gc  # as _PycapnpBacked
cdef class StructView(_PycapnpBacked):
    """A struct of a message, read field by field straight from the message's bytes.

    An attribute the view's layout names (a non-union field of a type it follows) is read
    from the bytes when asked: numbers and bools as pycapnp gives them, enums as
    :class:`EnumValue`, text as ``str``, data as ``bytes``, lists of those as ``list``, a
    nested struct or group as another view. Everything else — union members, ``which()``,
    ``to_dict()``, ``as_builder()``, lists of structs, ``dir()``, ``str()``, a pointer
    this reader does not follow (far pointers, damage, a budget exceeded) — is asked of a
    pycapnp reader of the same struct, made once, on first need, from the parent's (the
    root's from the message). So every attribute has pycapnp's value, or pycapnp's error.
    """
    cdef Struct s

    def __getattribute__(self, name):
        field = self.layout.by_name.get(name)
        if field is not None:
            value = self._read(<Field>field, name)
            if value is not FALLBACK:
                return value
        elif name in _VIEW_OWN:  # the view's own, not its pycapnp reader's
            return PyObject_GenericGetAttr(self, name)
        reader = self._pycapnp()
        try:
            return getattr(reader, name)
        except AttributeError as e:
            raise _unknown_field(reader, name, self.name, e) from None

    cdef object _read(self, Field field, object name):
        cdef int kind = field.kind
        cdef Py_ssize_t where = field.where
        cdef _Walk walk = self.walk
        cdef const Struct *s = &self.s
        cdef Struct child
        if kind == KIND_BOOL:
            return bool(<uint8_t>data_bit(walk.buf, s, where) ^ <uint8_t>field.default)
        if kind <= KIND_FLOAT64 or kind == KIND_ENUM:
            return walk.primitive(s, kind, where, field.default, field.enum_values)
        if kind == KIND_GROUP:
            return self._child(s, field.struct_, name)
        walk.budget = walk.limit
        walk.depth = 0
        try:
            if kind == KIND_STRUCT:
                if where >= s.ptr_count:
                    empty_struct(&child, 0, walk.start, walk.end)
                else:
                    walk.struct_at(s.ptrs + 8 * where, &child)
                return self._child(&child, field.struct_, name)
            if kind == KIND_LIST and field.element.kind == KIND_STRUCT:
                return self._struct_list(s, field, name)
            if where >= s.ptr_count:
                return walk.null_value(field)
            return walk.pointer_value(s.ptrs + 8 * where, field)
        except _Unfollowed:
            return FALLBACK

    cdef StructListView _struct_list(self, const Struct *s, Field field, object name):
        return _list_view(self.message, self.walk, s, field, self, name)

    cdef StructView _child(self, const Struct *s, StructLayout layout, object name):
        cdef StructView view = StructView.__new__(StructView)
        view._place(self.message, self.walk, layout, self, name)
        view.s = s[0]
        return view



#: What a StructView answers itself rather than asking its pycapnp reader.
cdef frozenset _VIEW_OWN = frozenset(("__class__", "as_pycapnp"))


cdef object _unknown_field(object reader, object name, object label, object error):
    """``error`` (pycapnp's AttributeError for ``name`` on ``reader``) in one line naming
    the struct, the closest field and its fields, when ``name`` is not a field there."""
    if not isinstance(name, str) or name.startswith("__"):
        return error
    if getattr(error, "field_name", None) != name and "no such member" not in str(error):
        return error  # not a missing field (str() of pycapnp's own AttributeError is cheap)
    # start-up cost: pycapnp's error type, loaded on this error path only
    from msgq.schemas.field_errors import unknown_field_error
    try:
        return unknown_field_error(reader.schema, name, label if isinstance(label, str)
                                   else None)
    except Exception:  # a reader without a schema to name: pycapnp's error as it is
        return error


@cython.no_gc  # as _PycapnpBacked
cdef class StructListView(_PycapnpBacked):
    """A list of structs of a message, as pycapnp's list reader behaves: ``len()``,
    ``[i]`` (a :class:`StructView`; an index past the end raises IndexError, a negative
    one counts modulo the length, as pycapnp's), iteration; anything else is asked of a
    pycapnp list reader made once, on first need."""
    cdef Composite c

    def __len__(self):
        return self.c.count

    def __getitem__(self, int64_t index):
        cdef StructView view
        if index >= self.c.count:
            raise IndexError("Out of bounds")
        if index < 0:  # pycapnp's Python modulo (this module divides as C does)
            if self.c.count == 0:
                raise ZeroDivisionError("integer modulo by zero")
            index = index % self.c.count
            if index < 0:
                index += self.c.count
        view = StructView.__new__(StructView)
        view._place(self.message, self.walk, self.layout, self, index)
        view.s.data = self.c.first + index * self.c.step
        view.s.data_bytes = self.c.data_bytes
        view.s.ptrs = view.s.data + self.c.data_bytes
        view.s.ptr_count = self.c.ptr_count
        view.s.seg_start = self.walk.start
        view.s.seg_end = self.walk.end
        return view

    def __getattr__(self, name):
        return getattr(self._pycapnp(), name)


cdef StructListView _list_view(object message, _Walk walk, const Struct *s, Field field,
                               object parent, object name):
    """The list of structs of pointer field ``field`` of ``s`` (a null pointer: empty)."""
    cdef StructListView view = StructListView.__new__(StructListView)
    cdef Py_ssize_t at = s.ptrs + 8 * field.where
    cdef uint64_t w = 0
    if field.where < s.ptr_count:
        w = load64(walk.buf + at)
    if w != 0:
        walk.composite(at, w, &view.c)
    else:
        view.c.first = view.c.count = view.c.step = 0
        view.c.data_bytes = view.c.ptr_count = 0
    view._place(message, walk, field.element.struct_, parent, name)
    return view


def view_member(bytes message, CompiledMember member not None, object decode,
                bint decode_takes_message=False):
    """A :class:`StructView` of the root union's ``member`` (a struct; compiled by
    :func:`compile_member` from reader_layouts.view_member_layout) in ``message``
    (exactly one framed message, one segment), or FALLBACK when this reader does not
    follow the message as far as that struct (pycapnp decodes it then). ``decode()``
    gives the member's pycapnp reader, for what the view does not read itself — or,
    with ``decode_takes_message``, ``decode(message)`` (one callable per member serves
    every message: no object made per view)."""
    cdef _PycapnpBacked root_view
    cdef Py_ssize_t n = len(message)
    cdef const uint8_t *buf = <const uint8_t *>(<char *>message)
    cdef Py_ssize_t words
    cdef _Walk walk
    cdef Struct root, payload
    cdef Py_ssize_t where = member.field.where
    cdef StructView view
    cdef Field field = member.field
    cdef bint is_list = field.kind == KIND_LIST and field.element.kind == KIND_STRUCT
    if field.kind != KIND_STRUCT and not is_list:
        return FALLBACK
    words = framed_words(buf, n)
    if words < 0:
        return FALLBACK  # not exactly one segment
    walk = _Walk.__new__(_Walk)
    walk.buf = buf
    walk.start = 8
    walk.end = n
    walk.limit = walk.budget = 8 * words
    walk.depth = 0
    walk.views = True
    try:
        walk.struct_at(8, &root)
        if data_bits(walk.buf, &root, 2 * member.discriminant_offset, 2) != member.discriminant:
            return FALLBACK
        if is_list:
            root_view = _list_view(message, walk, &root, field, decode, None)
            root_view.decode_message = decode_takes_message
            return root_view
        if where >= root.ptr_count:
            empty_struct(&payload, 0, walk.start, walk.end)
        else:
            walk.struct_at(root.ptrs + 8 * where, &payload)
    except _Unfollowed:
        return FALLBACK
    view = StructView.__new__(StructView)
    view._place(message, walk, member.field.struct_, decode, None)
    view.decode_message = decode_takes_message
    view.s = payload
    return view


cdef class EventFields:
    """Where the root struct keeps logMonoTime, valid and the union discriminant, for
    :func:`identify` (msgq.schemas.framing.EventLayout's fields)."""
    cdef Py_ssize_t mono_byte, valid_byte, discriminant_byte
    cdef int valid_bit
    cdef uint64_t mono_default
    cdef bint valid_default
    cdef tuple services

    def __init__(self, Py_ssize_t mono_byte, Py_ssize_t valid_byte, int valid_bit,
                 Py_ssize_t discriminant_byte, tuple services, uint64_t mono_default,
                 bint valid_default):
        self.mono_byte = mono_byte
        self.valid_byte = valid_byte
        self.valid_bit = valid_bit
        self.discriminant_byte = discriminant_byte
        self.services = services
        self.mono_default = mono_default
        self.valid_default = valid_default


def identify(bytes message, EventFields fields not None):
    """``(logMonoTime, valid, service)`` of ``message`` when it is exactly one framed
    one-segment message whose root struct's data section lies in it and whose union holds
    a known member — EventLayout.identify's answer, in one C call —; FALLBACK for
    anything else (EventLayout.identify decides then: other framings, far pointers,
    unknown members, garbage)."""
    cdef Py_ssize_t n = len(message)
    cdef const uint8_t *buf = <const uint8_t *>(<char *>message)
    cdef uint64_t w, mono
    cdef Py_ssize_t data, size
    cdef bint valid
    cdef uint16_t which = 0
    if n < 16:
        return FALLBACK
    w = load64(buf)
    if w & 0xFFFFFFFF != 0 or 8 + 8 * <Py_ssize_t>(w >> 32) != n:
        return FALLBACK
    w = load64(buf + 8)
    if (w & 3) != 0:
        return FALLBACK
    data = pointer_target(8, w)  # only the data section must lie in the message
    size = 8 * <Py_ssize_t>((w >> 32) & 0xFFFF)
    if data < 16 or data + size > n:
        return FALLBACK
    mono = fields.mono_default
    if fields.mono_byte + 8 <= size:
        mono ^= load64(buf + data + fields.mono_byte)
    valid = fields.valid_default
    if fields.valid_byte < size:
        valid = ((buf[data + fields.valid_byte] >> fields.valid_bit) & 1) ^ valid
    if fields.discriminant_byte + 2 <= size:
        memcpy(&which, buf + data + fields.discriminant_byte, 2)
    if which >= len(fields.services):
        return FALLBACK
    return mono, bool(valid), fields.services[which]

