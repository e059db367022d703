# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The Event builder: what new_message returns, writing the encoding the typed reader
(schemas/_typed_reader.pyx) reads, with the same kind codes (schemas/_capnp_wire.pxd) and
layouts' default bits (builder_layouts.py makes its layouts).

A message is one growing segment (a bytearray) that is a valid Cap'n Proto message after
every call. What cereal code does in a control loop — set numbers, bools and enums (by
name), get or init nested structs and groups, pick union members, which(), to_bytes() —
is written straight into it. Anything else (text, data, lists, struct assignment,
reading an enum, to_dict(), any other pycapnp method or attribute, a value of another
type or out of range, :meth:`StructBuilder.as_pycapnp`) makes the message hand over, once:
it becomes a pycapnp builder made from those bytes. At that moment every struct of the
message this builder wrote is matched with its pycapnp twin by where it lies in the bytes
(not by the names of the fields that lead to it), and each :class:`StructBuilder` given
out before forwards to its own struct's twin from then on; one whose struct was no longer
in the message (re-initialised, or its union switched to another member) raises
:class:`StaleBuilderError` when used. So the result of every call is pycapnp's — the
value, or pycapnp's own error — and only the common calls are cheaper: no pycapnp code
runs in them, which in a 100 Hz loop with cold caches is most of their cost.

``type(b) is b.__class__`` for a builder: it is msgq's class, not pycapnp's
(``isinstance(b, capnp._DynamicStructBuilder)`` is False). pycapnp's own setters take
only pycapnp's objects: ``other.carState = msg.carState.as_pycapnp()``.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.object cimport PyObject_GenericGetAttr

# The kind codes, shared with the typed reader (Cython finds the .pxd from the source
# tree's root: the runtime package msgq.schemas is setup.py's mapping of schemas/).
from schemas._capnp_wire cimport *

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from libc.string cimport memset

#: A field that is not a union member.
BUILD_NO_DISCRIMINANT = -1

# The kinds builder_layouts.py gives fields (the typed reader's K_ codes).
K_STRUCT = KIND_STRUCT
K_GROUP = KIND_GROUP
K_ENUM = KIND_ENUM
K_VOID = KIND_VOID


class StaleBuilderError(RuntimeError):
    """A struct builder used after its message handed over to pycapnp, when its struct was
    no longer in the message at that moment (re-initialised, or its union switched to
    another member): take the struct again from the message."""


@cython.auto_pickle(False)  # (no pickling code: less to compile)
cdef class BuildLayout:
    """Where a struct's fields lie, for the builder (builder_layouts.py makes them):
    its section sizes, its union's discriminant offset (in 16-bit units; -1: no union),
    ``fields`` (name -> :class:`BuildField`, only those the builder writes itself) and
    ``members`` (discriminant -> the union member's name)."""

    cdef public int data_words
    cdef public int ptr_count
    cdef public int disc_offset
    cdef public dict fields
    cdef public dict members

    def __init__(self, int data_words, int ptr_count, int disc_offset):
        self.data_words = data_words
        self.ptr_count = ptr_count
        self.disc_offset = disc_offset
        self.fields = {}
        self.members = {}


@cython.auto_pickle(False)  # (no pickling code: less to compile)
cdef class BuildField:
    """One field: its kind (the reader's K_ codes), its offset (in units of its size, or
    its pointer index), the bits of its default, its discriminant (-1: none), and for a
    struct or group its :class:`BuildLayout` (made on first use from ``schema``: the
    layouts of a large schema are not all made up front), for an enum its names."""

    cdef public int kind
    cdef public int where
    cdef public uint64_t default
    cdef public int disc
    cdef public object sub
    cdef public object schema

    def __init__(self, int kind, int where, uint64_t default, int disc, object sub=None,
                 object schema=None):
        self.kind = kind
        self.where = where
        self.default = default
        self.disc = disc
        self.sub = sub
        self.schema = schema


cdef object _make_layout = None  # builder_layouts.build_layout, set by set_layout_maker


def set_layout_maker(maker):
    """The function that makes a struct's BuildLayout from its pycapnp schema."""
    global _make_layout
    _make_layout = maker


@cython.auto_pickle(False)  # (no pickling code: less to compile)
cdef class _Message:
    cdef bytearray buf
    cdef Py_ssize_t used  # bytes in use: the root pointer and every struct allocated
    cdef object fallback  # the pycapnp root builder, once the message handed over
    cdef object handover  # bytes -> that pycapnp builder (new_message's schema)
    cdef dict twins  # (data offset, layout) -> its pycapnp builder, made at the hand-over
    cdef BuildLayout root_layout
    cdef Py_ssize_t root_data

    cdef Py_ssize_t alloc(self, Py_ssize_t words) except -1:
        """Zeroed words at the end of the segment; their byte offset."""
        cdef Py_ssize_t at = self.used
        cdef Py_ssize_t need = at + words * 8
        cdef Py_ssize_t size = len(self.buf)
        if need > size:
            size = max(need, 2 * size)
            PyByteArray_Resize(self.buf, size)
            memset(PyByteArray_AS_STRING(self.buf) + self.used, 0, size - self.used)
        self.used = need
        return at

    cdef bytes encoded(self):
        """The message as to_bytes gives it: the segment table (one segment) and the
        segment."""
        cdef Py_ssize_t n = self.used
        cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 8)
        cdef char* p = out
        cdef uint32_t head[2]
        head[0] = 0
        head[1] = <uint32_t>(n // 8)
        memcpy(p, head, 8)
        memcpy(p + 8, PyByteArray_AS_STRING(self.buf), n)
        return out

    cdef object take_over(self):
        """The pycapnp builder that the message is from now on (made once), and the twin
        of every struct this builder wrote that is in the message now (``twins``)."""
        cdef object root
        if self.fallback is None:
            root = self.handover(self.encoded())
            self.twins = {}
            self.match(root, self.root_layout, self.root_data,
                       self.root_data + 8 * self.root_layout.data_words)
            self.fallback = root
        return self.fallback

    cdef int match(self, object twin, BuildLayout layout, Py_ssize_t data,
                   Py_ssize_t ptrs) except -1:
        """Records ``twin`` (pycapnp's builder of the struct of ``layout`` at byte ``data``)
        and, in it, the twins of the structs and groups this one holds: those this builder
        may have given out. A struct is known by where it lies: a re-initialised one lies
        elsewhere, so a builder of the one before finds no twin. The bytes are the message
        as it handed over (nothing writes them after)."""
        cdef BuildField f
        cdef BuildLayout sub
        cdef const char* buf = PyByteArray_AS_STRING(self.buf)
        cdef int disc = -1
        cdef uint64_t word
        cdef int32_t offset
        cdef Py_ssize_t ptr, at
        self.twins[(data, layout)] = twin
        if layout.disc_offset >= 0:
            disc = <int>_load(buf + data + 2 * layout.disc_offset, 2)
        for name, field in layout.fields.items():
            f = <BuildField>field
            if f.sub is None or (f.disc >= 0 and f.disc != disc):
                continue  # never reached (no layout made yet), or not the member set
            sub = <BuildLayout>f.sub
            if f.kind == KIND_GROUP:
                self.match(getattr(twin, name), sub, data, ptrs)
            elif f.kind == KIND_STRUCT:
                ptr = ptrs + 8 * f.where
                word = _load(buf + ptr, 8)
                offset = <int32_t>(<uint32_t>(word & 0xFFFFFFFF))
                if word == 0 or (offset & 3) != 0:
                    continue
                at = ptr + 8 + 8 * <Py_ssize_t>(offset >> 2)
                self.match(getattr(twin, name), sub, at, at + 8 * sub.data_words)
        return 0


cdef inline void _store(char* at, uint64_t bits, int size):
    memcpy(at, &bits, size)  # little-endian hosts (the ring's rule)


cdef inline uint64_t _load(const char* at, int size):
    cdef uint64_t bits = 0
    memcpy(&bits, at, size)
    return bits


cdef inline uint64_t _struct_pointer(Py_ssize_t ptr, Py_ssize_t at, BuildLayout layout):
    """The pointer word at byte ``ptr`` to a struct of ``layout`` at byte ``at`` (later in
    the segment)."""
    return ((<uint64_t>(<uint32_t>(((at - ptr - 8) // 8) << 2)))
            | (<uint64_t>layout.data_words << 32) | (<uint64_t>layout.ptr_count << 48))


cdef int _SIZE[11]
_SIZE[:] = [0, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8]
# The range of each integer kind (KIND_INT8 .. KIND_UINT64), as Python ints.
_LOWEST = (0, -(1 << 7), -(1 << 15), -(1 << 31), -(1 << 63), 0, 0, 0, 0)
_HIGHEST = (0, (1 << 7) - 1, (1 << 15) - 1, (1 << 31) - 1, (1 << 63) - 1, (1 << 8) - 1,
            (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1)


cdef StructBuilder _struct_builder(_Message msg, BuildLayout layout, Py_ssize_t data,
                                   Py_ssize_t ptrs):
    cdef StructBuilder out = StructBuilder.__new__(StructBuilder)
    out.msg = msg
    out.layout = layout
    out.data = data
    out.ptrs = ptrs
    return out


@cython.auto_pickle(False)  # (no pickling code: less to compile)
cdef class StructBuilder:
    """A struct of a message being built (the root Event, or one of its nested structs
    and groups): pycapnp's builder API, see the module's docstring. Its type is this
    class (``type(b) is b.__class__``); :meth:`as_pycapnp` gives pycapnp's builder of the
    same struct."""

    cdef _Message msg
    cdef BuildLayout layout
    cdef Py_ssize_t data  # byte offset of its data section in the segment
    cdef Py_ssize_t ptrs  # byte offset of its pointer section

    cdef object target(self):
        """This struct's twin in the pycapnp builder the message handed over to (matched
        at the hand-over); StaleBuilderError when it was not in the message then."""
        self.msg.take_over()
        twin = self.msg.twins.get((self.data, self.layout))
        if twin is None:
            raise StaleBuilderError(
                "this struct builder was taken before its message became a pycapnp "
                "builder, and its struct was no longer in the message then (initialised "
                "again, or its union switched to another member): take it again from the "
                "message")
        return twin

    cdef StructBuilder child(self, BuildLayout layout, Py_ssize_t data, Py_ssize_t ptrs,
                             str name):
        return _struct_builder(self.msg, layout, data, ptrs)

    cdef StructBuilder struct_at(self, BuildLayout layout, Py_ssize_t at, str name):
        """The struct of ``layout`` at byte ``at``, field ``name`` of this one."""
        return self.child(layout, at, at + 8 * layout.data_words, name)

    cdef int discriminant(self):
        return <int>_load(PyByteArray_AS_STRING(self.msg.buf) + self.data
                          + 2 * self.layout.disc_offset, 2)

    cdef void set_discriminant(self, int value):
        _store(PyByteArray_AS_STRING(self.msg.buf) + self.data + 2 * self.layout.disc_offset,
               <uint64_t>value, 2)

    cdef BuildLayout sub_layout(self, BuildField f):
        if f.sub is None:
            f.sub = _make_layout(f.schema)
        return <BuildLayout>f.sub

    cdef StructBuilder new_struct(self, BuildField f, str name):
        """A new zeroed struct for the pointer field ``f`` (any earlier one is left
        behind, as Cap'n Proto's init leaves it)."""
        cdef BuildLayout sub = self.sub_layout(f)
        cdef Py_ssize_t ptr = self.ptrs + 8 * f.where
        cdef Py_ssize_t at = ptr  # an empty struct: offset -1, as Cap'n Proto writes it
        if sub.data_words + sub.ptr_count:  # (not 0, a null pointer when it would follow)
            at = self.msg.alloc(sub.data_words + sub.ptr_count)
        _store(PyByteArray_AS_STRING(self.msg.buf) + ptr, _struct_pointer(ptr, at, sub), 8)
        return self.struct_at(sub, at, name)

    cdef StructBuilder init_struct(self, BuildField f, str name):
        """init(name) of the struct field ``f``: a new struct, and the union member set."""
        if f.disc >= 0:
            self.set_discriminant(f.disc)
        return self.new_struct(f, name)

    cdef object get_struct(self, BuildField f, str name):
        """The struct the pointer field ``f`` points to, made when null (as pycapnp's
        builder does); None when it is not one this builder wrote (hand over)."""
        cdef BuildLayout sub = self.sub_layout(f)
        cdef Py_ssize_t ptr = self.ptrs + 8 * f.where
        cdef uint64_t word = _load(PyByteArray_AS_STRING(self.msg.buf) + ptr, 8)
        cdef int32_t offset
        if word == 0:
            return self.new_struct(f, name)
        offset = <int32_t>(<uint32_t>(word & 0xFFFFFFFF))
        if (offset & 3) != 0 or <int>((word >> 32) & 0xFFFF) != sub.data_words \
                or <int>(word >> 48) != sub.ptr_count:
            return None
        return self.struct_at(sub, ptr + 8 + 8 * <Py_ssize_t>(offset >> 2), name)

    cdef object read(self, BuildField f):
        cdef const char* base = PyByteArray_AS_STRING(self.msg.buf) + self.data
        cdef int kind = f.kind
        cdef uint64_t bits
        cdef uint32_t bits32
        cdef float f32
        cdef double f64
        if kind == KIND_BOOL:
            bits = ((<const uint8_t*>base)[f.where >> 3] >> (f.where & 7)) & 1
            return bool(bits ^ f.default)
        bits = _load(base + f.where * _SIZE[kind], _SIZE[kind]) ^ f.default
        if kind == KIND_INT8:
            return <int8_t>bits
        if kind == KIND_INT16:
            return <int16_t>bits
        if kind == KIND_INT32:
            return <int32_t>bits
        if kind == KIND_INT64:
            return <int64_t>bits
        if kind == KIND_FLOAT32:
            bits32 = <uint32_t>bits
            memcpy(&f32, &bits32, 4)
            return <double>f32
        if kind == KIND_FLOAT64:
            memcpy(&f64, &bits, 8)
            return f64
        return bits  # the unsigned integers

    cdef bint write(self, BuildField f, object value) except -1:
        """Stores ``value`` in the data field ``f``; False when it is not a value this
        builder takes as is (pycapnp decides: it converts it or raises)."""
        cdef char* base
        cdef int kind = f.kind
        cdef uint64_t bits
        cdef uint32_t bits32
        cdef float f32
        cdef double f64
        cdef uint8_t* byte
        cdef int size
        if kind == KIND_BOOL:
            if value is True:
                bits = 1
            elif value is False:
                bits = 0
            else:
                return False
            base = PyByteArray_AS_STRING(self.msg.buf) + self.data
            byte = <uint8_t*>base + (f.where >> 3)
            if bits ^ f.default:
                byte[0] |= <uint8_t>(1 << (f.where & 7))
            else:
                byte[0] &= <uint8_t>~(1 << (f.where & 7))
            return True
        if kind == KIND_ENUM:
            if type(value) is not str:
                return False
            number = (<dict>f.sub).get(value)
            if number is None:
                return False
            bits = <uint64_t>number
        elif kind == KIND_FLOAT32 or kind == KIND_FLOAT64:
            if type(value) is not float and type(value) is not int:
                return False
            f64 = value
            if kind == KIND_FLOAT32:
                f32 = <float>f64
                memcpy(&bits32, &f32, 4)
                bits = bits32
            else:
                memcpy(&bits, &f64, 8)
        elif kind <= KIND_UINT64:
            if type(value) is not int:
                return False
            if not _LOWEST[kind] <= value <= _HIGHEST[kind]:
                return False
            if kind <= KIND_INT64:
                bits = <uint64_t>(<int64_t>value)
            else:
                bits = <uint64_t>value
        else:
            return False
        base = PyByteArray_AS_STRING(self.msg.buf) + self.data
        size = 2 if kind == KIND_ENUM else _SIZE[kind]
        _store(base + f.where * size, bits ^ f.default, size)
        return True

    def __getattribute__(self, str name):
        # This class's own attributes (which, to_bytes, init, ...) first, as in pycapnp;
        # any other name is a field, found without a failed lookup in the type first
        # (which would make and drop an AttributeError per field read: most of its cost,
        # cold), read here or asked of pycapnp.
        cdef BuildField f
        if name in _BUILDER_OWN:
            return PyObject_GenericGetAttr(self, name)
        if self.msg.fallback is None:
            f = self.layout.fields.get(name)
            if f is not None and (f.disc < 0 or self.discriminant() == f.disc):
                if f.kind == KIND_STRUCT:
                    got = self.get_struct(f, name)
                    if got is not None:
                        return got
                elif f.kind == KIND_GROUP:  # its parent's sections, its own fields
                    return self.child(self.sub_layout(f), self.data, self.ptrs, name)
                elif f.kind == KIND_VOID:
                    return None
                elif f.kind != KIND_ENUM:  # pycapnp reads enums as its own objects
                    return self.read(f)
        return getattr(self.target(), name)

    def __setattr__(self, str name, value):
        self.set_field(name, value)

    cdef int set_field(self, str name, object value) except -1:
        """Sets field ``name`` to ``value`` (pycapnp's setattr)."""
        cdef BuildField f
        if self.msg.fallback is None:
            f = self.layout.fields.get(name)
            if f is not None and f.kind <= KIND_ENUM and f.kind != KIND_TEXT \
                    and f.kind != KIND_DATA:
                if self.write(f, value):
                    if f.disc >= 0:
                        self.set_discriminant(f.disc)
                    return 0
            elif f is not None and f.kind == KIND_VOID and value is None:
                if f.disc >= 0:
                    self.set_discriminant(f.disc)
                return 0
        setattr(self.target(), name, value)
        return 0

    def init(self, str name, *args):
        """pycapnp's init: a struct member (here, when it is a struct of this schema and
        no size is given), or anything else through pycapnp."""
        cdef BuildField f
        if self.msg.fallback is None and not args:
            f = self.layout.fields.get(name)
            if f is not None and f.kind == KIND_STRUCT:
                return self.init_struct(f, name)
        return self.target().init(name, *args)

    def which(self):
        """The union member that is set (pycapnp's which(): its error where there is no
        union)."""
        if self.msg.fallback is None and self.layout.disc_offset >= 0:
            name = self.layout.members.get(self.discriminant())
            if name is not None:
                return name
        return self.target().which()

    def to_bytes(self):
        """The message's bytes (the root's: a nested struct's is pycapnp's answer)."""
        if self.msg.fallback is None and self.is_root():
            return self.msg.encoded()
        return self.target().to_bytes()

    cdef bint is_root(self):
        return self.data == self.msg.root_data and self.layout is self.msg.root_layout

    def as_pycapnp(self):
        """pycapnp's builder of this struct (``capnp._DynamicStructBuilder``), for code
        that needs pycapnp's own object, e.g. to assign the struct into a pycapnp
        builder (``other.carState = msg.carState.as_pycapnp()``): the message hands
        over, and this builder and that one are the same struct from then on."""
        return self.target()

    @property
    def handed_over(self):
        """Whether the message is a pycapnp builder now (tests and benchmarks ask)."""
        return self.msg.fallback is not None

    def __dir__(self):
        return dir(self.target())

    def __repr__(self):
        try:
            return repr(self.target())
        except StaleBuilderError:
            return "<msgq struct builder of a struct no longer in its message>"

    def __str__(self):
        return str(self.target())


def built_bytes(StructBuilder msg not None, str service):
    """The bytes of ``msg`` when it is a message's root carrying union member
    ``service``; None otherwise (a nested struct, another member, no union: ask
    pycapnp). PubMaster.send's one call for ``which()`` and ``to_bytes()``."""
    cdef object name
    if not msg.is_root():
        return None
    if msg.msg.fallback is not None:  # handed over: pycapnp's builder answers
        return msg.to_bytes() if msg.which() == service else None
    if msg.layout.disc_offset < 0:
        return None
    name = msg.layout.members.get(msg.discriminant())
    if name is None or name != service:
        return None
    return msg.msg.encoded()


#: The names StructBuilder answers itself before any field: every attribute of its type
#: (methods, properties, object's own), so no other name can be found in the type.
cdef frozenset _BUILDER_OWN = frozenset(dir(StructBuilder))


@cython.auto_pickle(False)  # (no pickling code: less to compile)
cdef class EventFactory:
    """new_message's builder for one schema's Event: ``layout`` (the Event's), ``handover``
    (bytes -> the pycapnp builder a message becomes when it hands over) and the union
    members it initialises itself (``members``: the struct ones)."""

    cdef BuildLayout layout
    cdef object handover
    cdef public frozenset members

    def __init__(self, BuildLayout layout, object handover):
        self.layout = layout
        self.handover = handover
        members = []
        for name in layout.members.values():
            f = layout.fields.get(name)
            if f is not None and (<BuildField>f).kind == KIND_STRUCT:
                members.append(name)
        self.members = frozenset(members)

    def new(self, object service, object mono_ns):
        """A new Event: logMonoTime ``mono_ns``, valid False, the union member
        ``service`` (one of ``members``, or None) initialised."""
        cdef StructBuilder root = new_root(self.layout, self.handover)
        root.set_field("logMonoTime", mono_ns)
        root.set_field("valid", False)
        if service is not None:
            root.init_struct(self.layout.fields[service], service)
        return root


cpdef StructBuilder new_root(BuildLayout layout, object handover):
    """An empty root struct of ``layout`` in a new message; ``handover`` makes the
    pycapnp builder of the message's bytes when it hands over."""
    cdef _Message msg = _Message.__new__(_Message)
    msg.buf = bytearray(256)
    msg.used = 0
    msg.handover = handover
    cdef Py_ssize_t ptr = msg.alloc(1)
    cdef Py_ssize_t at = msg.alloc(layout.data_words + layout.ptr_count)
    _store(PyByteArray_AS_STRING(msg.buf) + ptr, _struct_pointer(ptr, at, layout), 8)
    msg.root_layout = layout
    msg.root_data = at
    return _struct_builder(msg, layout, at, at + 8 * layout.data_words)
