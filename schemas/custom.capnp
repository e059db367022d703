@0x8c93d1022c3ca7f7;

# Reserved custom slots. The Event union in log.capnp carries one field per struct below
# (customReserved0 .. customReserved9). An application that needs its own message adds
# fields to one of these structs in its copy of this file — nothing else changes, so logs
# recorded with and without the custom fields stay readable by both builds (unknown
# fields are skipped by readers, missing ones read as their defaults).
#
# Rules for filling a slot: add fields with the next free ordinal (@0, @1, ...), never
# reuse or renumber an ordinal, never change a field's type. Rename the struct if you
# like; the ordinal of the slot in the Event union is what travels on the wire.

struct CustomReserved0 {}
struct CustomReserved1 {}
struct CustomReserved2 {}
struct CustomReserved3 {}
struct CustomReserved4 {}
struct CustomReserved5 {}
struct CustomReserved6 {}
struct CustomReserved7 {}
struct CustomReserved8 {}
struct CustomReserved9 {}
