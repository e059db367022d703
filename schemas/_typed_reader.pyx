# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The typed reader: fields read straight from a Cap'n Proto message's bytes by following
the encoding with a layout built from the schema, instead of through pycapnp one attribute
at a time. Two users: Spark's typed columns (:func:`read_member`: the values a union member
of the root struct converts to, capnp_types.py's rules) and SubMaster's payload views
(:func:`view_member`: a :class:`StructView` that reads each field when asked, and hands
anything it does not follow to a pycapnp reader of the same struct).

The bytes come from files: untrusted. Every pointer is checked against the segment, the
words read are budgeted (8 times the message, as a traversal limit; a list of
zero-sized structs is charged per element) and nesting is bounded. Anything this reader
does not follow — several segments, far pointers, a list encoded with another element
size than its type's, an unknown union member, text that is not UTF-8 with its NUL, a
root union holding another member, a budget or depth exceeded — makes ``read_member``
return FALLBACK,
and the caller converts that message with pycapnp as before (same values, same errors).
So the result is pycapnp's for every message, only faster for the common ones.

Layouts are tuples (reader_layouts.py places fields; capnp_types.py builds Spark's):
field ``(kind, where, default, extra)``, struct ``(fields, union)`` — or, for views,
``(fields, None, names)``: the fields a view reads by name, union members left out —, union
``(discriminant_offset, {discriminant: (name, index or -1, field or None)}, count)``;
:func:`compile_member` turns a member's into typed objects once (per worker process), so
that reading a field costs C struct accesses, not tuple lookups and conversions.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8

# Field and element kinds (capnp_types.py builds layouts with the K_ names).
cdef enum:
    C_BOOL = 0
    C_INT8 = 1
    C_INT16 = 2
    C_INT32 = 3
    C_INT64 = 4
    C_UINT8 = 5
    C_UINT16 = 6
    C_UINT32 = 7
    C_UINT64 = 8
    C_FLOAT32 = 9
    C_FLOAT64 = 10
    C_TEXT = 11
    C_DATA = 12
    C_ENUM = 13
    C_LIST = 14
    C_STRUCT = 15
    C_GROUP = 16

K_BOOL = C_BOOL
K_INT8 = C_INT8
K_INT16 = C_INT16
K_INT32 = C_INT32
K_INT64 = C_INT64
K_UINT8 = C_UINT8
K_UINT16 = C_UINT16
K_UINT32 = C_UINT32
K_UINT64 = C_UINT64
K_FLOAT32 = C_FLOAT32
K_FLOAT64 = C_FLOAT64
K_TEXT = C_TEXT
K_DATA = C_DATA
K_ENUM = C_ENUM
K_LIST = C_LIST
K_STRUCT = C_STRUCT
K_GROUP = C_GROUP

#: What read_member returns for a message it leaves to pycapnp.
FALLBACK = object()

cdef int MAX_DEPTH = 64
# capnp list element size codes
cdef enum:
    SZ_BIT = 1
    SZ_BYTE = 2
    SZ_TWO = 3
    SZ_FOUR = 4
    SZ_EIGHT = 5
    SZ_POINTER = 6
    SZ_COMPOSITE = 7


cdef inline int element_size(int kind) noexcept:
    """The list element size code of a list of ``kind`` elements."""
    if kind == C_BOOL:
        return SZ_BIT
    if kind == C_INT8 or kind == C_UINT8:
        return SZ_BYTE
    if kind == C_INT16 or kind == C_UINT16 or kind == C_ENUM:
        return SZ_TWO
    if kind == C_INT32 or kind == C_UINT32 or kind == C_FLOAT32:
        return SZ_FOUR
    if kind == C_INT64 or kind == C_UINT64 or kind == C_FLOAT64:
        return SZ_EIGHT
    if kind == C_STRUCT:
        return SZ_COMPOSITE
    return SZ_POINTER  # text, data, lists


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
    if f.kind == C_ENUM:
        f.names = extra
        f.enum_values = {number: EnumValue._of(number, name) for number, name in extra.items()}
    elif f.kind == C_LIST:
        f.element = _compile_field(extra)
    elif f.kind == C_STRUCT or f.kind == C_GROUP:
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


def compile_member(tuple member):
    """``(discriminant_offset, discriminant, field layout)`` (capnp_types.member_plan)
    compiled for :func:`read_member`."""
    cdef CompiledMember c = CompiledMember.__new__(CompiledMember)
    c.discriminant_offset = member[0]
    c.discriminant = member[1]
    c.field = _compile_field(member[2])
    return c


cdef struct Struct:
    Py_ssize_t data       # byte offset of the data section
    Py_ssize_t data_bytes
    Py_ssize_t ptrs       # byte offset of the pointer section
    Py_ssize_t ptr_count


cdef struct Composite:
    Py_ssize_t first      # byte offset of the first element
    Py_ssize_t count
    Py_ssize_t step       # bytes per element
    Py_ssize_t data_bytes
    Py_ssize_t ptr_count


cdef inline uint64_t load64(const uint8_t *p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v


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
        cdef Py_ssize_t target, dw, pw
        s.data = s.ptrs = at
        s.data_bytes = s.ptr_count = 0
        if w == 0:
            return 0
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
            <uint16_t>self.raw_bits(s, 2 * layout.discriminant_offset, 2))
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

    cdef inline uint64_t raw_bits(self, const Struct *s, Py_ssize_t byte, int width) noexcept:
        """``width`` bytes at ``byte`` of the data section, zero beyond it."""
        cdef uint64_t v = 0
        if byte + width <= s.data_bytes:
            memcpy(&v, self.buf + s.data + byte, width)
        return v

    cdef object read_field(self, const Struct *s, Field field):
        cdef int kind = field.kind
        cdef Py_ssize_t where = field.where
        cdef uint64_t raw
        if kind == C_BOOL:
            raw = 0
            if where // 8 < s.data_bytes:
                raw = (self.buf[s.data + where // 8] >> (where % 8)) & 1
            return bool(raw ^ field.default)
        if kind <= C_FLOAT64 or kind == C_ENUM:
            return self.primitive(s, kind, where, field.default,
                                  field.enum_values if self.views else field.names)
        if kind == C_GROUP:
            return self.read_struct(s, field.struct_)
        # pointer fields: where is the pointer index
        if where >= s.ptr_count:
            return self.null_value(field)
        return self.pointer_value(s.ptrs + 8 * where, field)

    cdef object primitive(self, const Struct *s, int kind, Py_ssize_t where,
                          uint64_t default, object names):
        cdef uint64_t raw
        cdef float f
        cdef double d
        cdef uint32_t raw32
        if kind == C_INT8 or kind == C_UINT8:
            raw = self.raw_bits(s, where, 1) ^ default
            if kind == C_INT8:
                return <int8_t>raw
            return <uint8_t>raw
        if kind == C_INT16 or kind == C_UINT16 or kind == C_ENUM:
            raw = self.raw_bits(s, 2 * where, 2) ^ default
            if kind == C_ENUM:
                name = names.get(<uint16_t>raw)
                if self.views:
                    return name if name is not None else EnumValue._of(<uint16_t>raw, None)
                return name if name is not None else str(<uint16_t>raw)
            if kind == C_INT16:
                return <int16_t>raw
            return <uint16_t>raw
        if kind == C_INT32 or kind == C_UINT32 or kind == C_FLOAT32:
            raw32 = <uint32_t>(self.raw_bits(s, 4 * where, 4) ^ default)
            if kind == C_FLOAT32:
                memcpy(&f, &raw32, 4)
                return <double>f
            if kind == C_INT32:
                return <int32_t>raw32
            return raw32
        raw = self.raw_bits(s, 8 * where, 8) ^ default
        if kind == C_FLOAT64:
            memcpy(&d, &raw, 8)
            return d
        if kind == C_INT64:
            return <int64_t>raw
        return raw

    cdef object null_value(self, Field field):
        cdef int kind = field.kind
        cdef Struct empty
        if kind == C_TEXT:
            return ""
        if kind == C_DATA:
            return b""
        if kind == C_LIST:
            return []
        empty.data = empty.ptrs = 0
        empty.data_bytes = empty.ptr_count = 0
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
        if field.kind == C_STRUCT:
            self.struct_at(at, &s)
            return self.nested(&s, field.struct_)
        return self.list_at(at, w, field)

    cdef int composite(self, Py_ssize_t at, uint64_t w, Composite *c) except -1:
        """The list of structs the (non-null) list pointer ``w`` at byte ``at`` points
        to, checked: a composite list whose elements lie inside the segment."""
        cdef Py_ssize_t target, words, count, dw, pw
        if (w & 3) != 1 or ((w >> 32) & 7) != SZ_COMPOSITE:
            raise _Unfollowed()
        target = at + 8 + 8 * <Py_ssize_t>(<int32_t>(<uint32_t>w) >> 2)
        words = <Py_ssize_t>(w >> 35)  # the word count, after the tag
        if target < self.start or target + 8 + 8 * words > self.end:
            raise _Unfollowed()
        w = load64(self.buf + target)
        if (w & 3) != 0:
            raise _Unfollowed()
        count = <Py_ssize_t>((w >> 2) & 0x3FFFFFFF)
        dw = (w >> 32) & 0xFFFF
        pw = (w >> 48) & 0xFFFF
        if count * (dw + pw) > words:
            raise _Unfollowed()
        # A list of zero-sized structs claims any count in no bytes: its elements are
        # charged one word each (as capnp's amplified reads are), so that a few bytes
        # cannot make millions of tuples.
        self.spend((count if count > words else words) + 1)
        c.first = target + 8
        c.count = count
        c.step = 8 * (dw + pw)
        c.data_bytes = 8 * dw
        c.ptr_count = pw
        return 0

    cdef object list_at(self, Py_ssize_t at, uint64_t w, Field field):
        """The value of a list pointer: text, data, or a list of the field's elements."""
        cdef Py_ssize_t target, count, i, words, dw, pw, step
        cdef int size, ekind, kind = field.kind
        cdef Field element
        cdef Struct s
        cdef Composite c
        cdef object value
        cdef const uint8_t *p
        cdef float f
        cdef double d
        cdef int32_t i32
        cdef int64_t i64
        if (w & 3) != 1:
            raise _Unfollowed()
        target = at + 8 + 8 * <Py_ssize_t>(<int32_t>(<uint32_t>w) >> 2)
        size = (w >> 32) & 7
        count = <Py_ssize_t>(w >> 35)
        if target < self.start:
            raise _Unfollowed()
        if kind == C_TEXT or kind == C_DATA:
            if size != SZ_BYTE or target + count > self.end:
                raise _Unfollowed()
            self.spend((count + 7) // 8)
            if kind == C_DATA:
                return PyBytes_FromStringAndSize(<const char *>self.buf + target, count)
            if count == 0 or self.buf[target + count - 1] != 0:
                raise _Unfollowed()  # text needs its NUL
            try:
                return PyUnicode_DecodeUTF8(<const char *>self.buf + target, count - 1, NULL)
            except UnicodeDecodeError:
                raise _Unfollowed()
        element = field.element
        ekind = element.kind
        if ekind == C_GROUP or size != element_size(ekind):
            raise _Unfollowed()  # another encoding than the type's: pycapnp converts
        if ekind == C_STRUCT:
            if self.views:
                raise _Unfollowed()  # views: a StructListView, made by the view itself
            self.composite(at, w, &c)
            out = PyList_New(c.count)
            s.data_bytes = c.data_bytes
            s.ptr_count = c.ptr_count
            for i in range(c.count):
                s.data = c.first + i * c.step
                s.ptrs = s.data + c.data_bytes
                value = self.nested(&s, element.struct_)
                Py_INCREF(value)
                PyList_SET_ITEM(out, i, value)
            return out
        if size == SZ_BIT:
            words = (count + 63) // 64
        elif size == SZ_POINTER:
            words = count
        else:
            words = (count * (1 << (size - 2)) + 7) // 8
        if target + 8 * words > self.end:
            raise _Unfollowed()
        self.spend(words if words else 1)
        out = PyList_New(count)
        p = self.buf + target
        if size == SZ_POINTER:
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
        s.data = target
        s.data_bytes = 8 * words
        s.ptrs = target
        s.ptr_count = 0
        for i in range(count):  # the common lists without a call per element
            if ekind == C_FLOAT32:
                memcpy(&f, p + 4 * i, 4)
                value = <double>f
            elif ekind == C_FLOAT64:
                memcpy(&d, p + 8 * i, 8)
                value = d
            elif ekind == C_INT32:
                memcpy(&i32, p + 4 * i, 4)
                value = i32
            elif ekind == C_INT64:
                memcpy(&i64, p + 8 * i, 8)
                value = i64
            elif ekind == C_BOOL:
                value = bool((p[i // 8] >> (i % 8)) & 1)
            else:
                value = self.primitive(&s, ekind, i, 0,
                                       element.enum_values if self.views else element.names)
            Py_INCREF(value)
            PyList_SET_ITEM(out, i, value)
        return out


def read_member(const uint8_t[::1] message, CompiledMember member not None):
    """The converted value of a union member of the root struct in ``message`` (one
    framed message), or FALLBACK when pycapnp should read this message. ``member``: from
    :func:`compile_member`; a message whose root union holds another member is handed
    back too, as pycapnp fails on it."""
    cdef Py_ssize_t n = message.shape[0]
    cdef uint32_t words
    cdef _Walk walk
    cdef Struct root
    if n < 16 or message[0] != 0 or message[1] != 0 or message[2] != 0 or message[3] != 0:
        return FALLBACK  # not exactly one segment
    words = message[4] | (message[5] << 8) | (message[6] << 16) | (<uint32_t>message[7] << 24)
    if 8 + 8 * <Py_ssize_t>words != n:
        return FALLBACK
    walk = _Walk.__new__(_Walk)
    walk.buf = &message[0]
    walk.start = 8
    walk.end = n
    walk.budget = 8 * <Py_ssize_t>words
    walk.depth = 0
    try:
        walk.struct_at(8, &root)
        if walk.raw_bits(&root, 2 * member.discriminant_offset, 2) != member.discriminant:
            return FALLBACK
        return walk.read_field(&root, member.field)
    except _Unfollowed:
        return FALLBACK


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
        cdef uint8_t raw
        if kind == C_BOOL:
            raw = 0
            if where // 8 < s.data_bytes:
                raw = (walk.buf[s.data + where // 8] >> (where % 8)) & 1
            return bool(raw ^ <uint8_t>field.default)
        if kind <= C_FLOAT64 or kind == C_ENUM:
            return walk.primitive(s, kind, where, field.default, field.enum_values)
        if kind == C_GROUP:
            return self._child(s, field.struct_, name)
        walk.budget = walk.limit
        walk.depth = 0
        try:
            if kind == C_STRUCT:
                if where >= s.ptr_count:
                    child.data = child.ptrs = 0
                    child.data_bytes = child.ptr_count = 0
                else:
                    walk.struct_at(s.ptrs + 8 * where, &child)
                return self._child(&child, field.struct_, name)
            if kind == C_LIST and field.element.kind == C_STRUCT:
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



cdef object _unknown_field(object reader, object name, object label, object error):
    """``error`` (pycapnp's AttributeError for ``name`` on ``reader``) in one line naming
    the struct, the closest field and its fields, when ``name`` is not a field there."""
    if not isinstance(name, str) or name.startswith("__"):
        return error
    if getattr(error, "field_name", None) != name and "no such member" not in str(error):
        return error  # not a missing field (str() of pycapnp's own AttributeError is cheap)
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
    cdef uint32_t words
    cdef _Walk walk
    cdef Struct root, payload
    cdef Py_ssize_t where = member.field.where
    cdef StructView view
    cdef Field field = member.field
    cdef bint is_list = field.kind == C_LIST and field.element.kind == C_STRUCT
    if field.kind != C_STRUCT and not is_list:
        return FALLBACK
    if n < 16 or load64(buf) & 0xFFFFFFFF != 0:
        return FALLBACK  # not exactly one segment
    words = <uint32_t>(load64(buf) >> 32)
    if 8 + 8 * <Py_ssize_t>words != n:
        return FALLBACK
    walk = _Walk.__new__(_Walk)
    walk.buf = buf
    walk.start = 8
    walk.end = n
    walk.limit = walk.budget = 8 * <Py_ssize_t>words
    walk.depth = 0
    walk.views = True
    try:
        walk.struct_at(8, &root)
        if walk.raw_bits(&root, 2 * member.discriminant_offset, 2) != member.discriminant:
            return FALLBACK
        if is_list:
            root_view = _list_view(message, walk, &root, field, decode, None)
            root_view.decode_message = decode_takes_message
            return root_view
        if where >= root.ptr_count:
            payload.data = payload.ptrs = 0
            payload.data_bytes = payload.ptr_count = 0
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
    cdef Py_ssize_t data, size, offset
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
    offset = <Py_ssize_t>(<int32_t>(<uint32_t>w) >> 2)
    data = 16 + 8 * offset
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
