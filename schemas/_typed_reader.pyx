# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The typed reader: fields read straight from a Cap'n Proto message's bytes by following
the encoding with a layout built from the schema, instead of through pycapnp one attribute
at a time (its writing twin, the Event builder that new_message returns, is
schemas/_event_builder.pyx). Two users of the reader: Spark's typed columns (:func:`read_member`:
the values a union member of the root struct converts to, capnp_types.py's rules) and
SubMaster's payload views
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
from libc.string cimport memcpy
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


def compile_member(tuple member):
    """``(discriminant_offset, discriminant, field layout)`` (capnp_types.member_plan)
    compiled for :func:`read_member`."""
    cdef CompiledMember c = CompiledMember.__new__(CompiledMember)
    c.discriminant_offset = member[0]
    c.discriminant = member[1]
    c.field = _compile_field(member[2])
    return c


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

    cdef object list_at(self, Py_ssize_t at, uint64_t w, Field field):
        """The value of a list pointer: text, data, or a list of the field's elements."""
        cdef Py_ssize_t target, count, i, words, n
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
        target = pointer_target(at, w)
        size = list_size(w)
        count = list_count(w)
        if target < self.start:
            raise _Unfollowed()
        if kind == KIND_TEXT or kind == KIND_DATA:
            n = blob_in(self.buf, w, target, self.end, kind == KIND_TEXT)
            if n < 0:
                raise _Unfollowed()  # not bytes, past the segment, or text without its NUL
            self.spend((count + 7) // 8)
            if kind == KIND_DATA:
                return PyBytes_FromStringAndSize(<const char *>self.buf + target, n)
            try:
                return PyUnicode_DecodeUTF8(<const char *>self.buf + target, n, NULL)
            except UnicodeDecodeError:
                raise _Unfollowed()
        element = field.element
        ekind = element.kind
        if ekind == KIND_GROUP or size != element_size(ekind):
            raise _Unfollowed()  # another encoding than the type's: pycapnp converts
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
        words = list_words(size, count)
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
        empty_struct(&s, target, self.start, self.end)
        s.data_bytes = 8 * words  # the elements as a data section: primitive() reads them
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
        if data_bits(walk.buf, &root, 2 * member.discriminant_offset, 2) != member.discriminant:
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
    cdef uint32_t words
    cdef _Walk walk
    cdef Struct root, payload
    cdef Py_ssize_t where = member.field.where
    cdef StructView view
    cdef Field field = member.field
    cdef bint is_list = field.kind == KIND_LIST and field.element.kind == KIND_STRUCT
    if field.kind != KIND_STRUCT and not is_list:
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

