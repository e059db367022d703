# cython: language_level=3, boundscheck=False, cdivision=True
"""SubMaster's update, compiled: the newest message of every socket, identified from its
bytes, the per-service bookkeeping and the health verdicts, in one C function over the
SubMaster's own dicts (the rules are sub_master.py's docstring and frequency.py's; the
rate-band rule itself is :func:`rate_in_band` here, which frequency.py re-exports).

Why compiled: a 100 Hz control loop runs each update after a 10 ms sleep, with the
caches cold; what an update costs then is what it touches — each Python function, module
and object is a cold fetch. Here an update is one call that touches the sockets, the
dicts it stores into and the receive-time deques, nothing else (docs/messaging.md,
"What a cold tick touches").

Layer: a service (msgq.messaging), like sub_master.py: over the sockets and the Event
layer's identify.
"""

cimport cython
from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetItem
from cpython.object cimport PyObject

from msgq import clock
from msgq.schemas import _typed_reader as reader

cdef object FALLBACK = reader.FALLBACK
cdef object _identify = reader.identify
cdef object _view_member = reader.view_member


def payload(sm, service):
    """``SubMaster.__getitem__`` (``sm[s]``): the payload of ``service``'s newest message,
    a view over its bytes made at the first read after an update took it (pycapnp's
    reader where the typed reader does not follow them; the previous payload, with
    ``bad_messages[s]`` counted, where pycapnp refuses them too). Compiled, and bound as
    the method: a control loop reads every payload through it, cold, and a Python frame
    per read was most of what a read cost."""
    return (<Updater?>sm._updater).payload(service)


cpdef bint rate_in_band(object times, Py_ssize_t recent, double min_hz,
                        double max_hz) except -1:
    """Whether the average rate over all the intervals between ``times`` (receive times,
    oldest first: a deque or list), or over the last ``recent`` of them, lies in
    ``[min_hz, max_hz]`` (:attr:`msgq.messaging.frequency.FrequencyTracker.ok`; the
    update asks it at every message of a rate-tracked service)."""
    cdef Py_ssize_t count = len(times) - 1
    if count <= 0:
        return False  # no interval: rate 0, below any band (min_hz > 0)
    cdef double last = times[count]
    cdef double span = last - <double>times[0]
    if span > 0.0 and min_hz <= count / span <= max_hz:
        return True
    if recent < count:
        count = recent
    span = last - <double>times[len(times) - 1 - count]
    return span > 0.0 and min_hz <= count / span <= max_hz


@cython.auto_pickle(False)
@cython.final
cdef class Updater:
    """One SubMaster's update state: the dicts it fills (the SubMaster's own objects,
    shared, so ``sm.updated`` and the others are what this writes) and what it keeps
    between updates. ``frame``: the number of updates so far minus one (cereal's)."""

    cdef public long long frame
    cdef dict updated, not_updated, seen, alive, freq_ok, valid, recv_time, recv_frame
    cdef dict log_mono_time, bad_messages, pending, rate_ok, tracked_of
    cdef dict service_of_sock
    cdef object data
    cdef dict members, decoders
    cdef object decode
    cdef list services, tracked, untracked, non_polled
    cdef object fields, identify_slow
    cdef bint simulation
    cdef double next_expiry, last_health

    def __init__(self, sm, views, list tracked):
        """``sm``: the SubMaster, its dicts made; ``views``: its schema's PayloadViews;
        ``tracked``: (service, FrequencyTracker, seconds a message keeps it alive) of each
        rate-tracked service."""
        self.frame = -1
        self.updated = sm.updated
        self.not_updated = dict.fromkeys(sm.services, False)
        self.seen = sm.seen
        self.alive = sm.alive
        self.freq_ok = sm.freq_ok
        self.valid = sm.valid
        self.recv_time = sm.recv_time
        self.recv_frame = sm.recv_frame
        self.log_mono_time = sm.logMonoTime
        self.bad_messages = sm.bad_messages
        self.data = sm.data
        self.pending = sm.data.pending
        # what sm[s] needs (payload): the compiled layouts, pycapnp's reader of a view's
        # message, and the decoding of what the typed reader does not follow
        self.members = sm._members
        self.decoders = sm._decoders
        self.decode = sm.data._decode
        self.services = list(sm.services)
        self.simulation = sm.simulation
        self.service_of_sock = {id(sock): s for s, sock in sm.sock.items()}
        self.non_polled = [(s, sm.sock[s]) for s in sm.non_polled_services]
        self.tracked = tracked
        self.untracked = [s for s in sm.services if s not in sm.freq_tracker]
        # what a message of a rate-tracked service updates and its verdict reads: (receive
        # times, recent intervals, band, seconds a message keeps the service alive)
        self.tracked_of = {s: (t.times, t.recent_intervals, t.min_hz, t.max_hz, alive_s)
                           for s, t, alive_s in self.tracked}
        self.rate_ok = dict.fromkeys(sm.services, False)  # verdict at the last message
        self.fields = views.event_fields
        self.identify_slow = views.identify
        self.next_expiry = float("-inf")  # the first update makes the whole pass
        self.last_health = float("-inf")

    def update(self, list ready):
        """One update, given the polled sockets that have data: the newest message of
        each service is identified from its bytes and kept as bytes (decoded when read),
        its bookkeeping stored, and the health of every service updated."""
        cdef object now = clock.monotonic()
        cdef object frame = self.begin()
        cdef list new = []
        for sock in ready:
            self.take(self.service_of_sock[id(sock)], sock, now, frame, new)
        for s, sock in self.non_polled:
            self.take(s, sock, now, frame, new)
        self.health(now, new)

    def update_with(self, double cur_time, list received):
        """One update of messages decoded elsewhere (``SubMaster.update_msgs``):
        ``received`` holds (service, logMonoTime, valid, payload) tuples, the payload as
        bytes (decoded when read) or a reader, all received at ``cur_time``; services this
        SubMaster does not subscribe to are skipped."""
        cdef object now = cur_time
        cdef object frame = self.begin()
        cdef list new = []
        for s, mono, valid, payload in received:
            if s not in self.data:
                continue
            if isinstance(payload, bytes):
                self.pending[s] = payload
            else:
                self.data[s] = payload
            self.store(s, mono, valid, now, frame, new)
        self.health(cur_time, new)

    cpdef object payload(self, object service):
        """``sm[service]`` (see :func:`payload`)."""
        data = self.pending.pop(service, None)
        if data is not None:
            member = self.members[service]
            view = FALLBACK if member is None else \
                _view_member(data, member, self.decoders[service], True)
            value = view if view is not FALLBACK else self.decode(service, data)
            if value is not None:
                # the dict's own store: sm.data's __setitem__ would drop pending bytes
                PyDict_SetItem(self.data, service, value)
        cdef PyObject *found = PyDict_GetItemWithError(self.data, service)
        if found == NULL:
            raise KeyError(f"service {service!r} is not subscribed by this SubMaster "
                           f"(it has {self.services})")
        return <object>found

    cdef object begin(self):
        """A new update: its frame number; no service updated yet."""
        self.frame += 1
        self.updated.update(self.not_updated)
        return self.frame

    cdef int take(self, str s, object sock, object now, object frame, list new) except -1:
        """The newest message of ``s`` on ``sock``, if any: identified, kept, counted."""
        cdef object data = sock.receive(True)
        if data is None:
            return 0
        cdef object peeked = _identify(data, self.fields) if type(data) is bytes \
            else FALLBACK
        if peeked is FALLBACK:
            peeked = self.identify_slow(data)
        if peeked is None or (<tuple>peeked)[2] != s:
            self.bad_messages[s] += 1
            return 0
        self.pending[s] = data
        return self.store(s, (<tuple>peeked)[0], (<tuple>peeked)[1], now, frame, new)

    cdef int store(self, str s, object mono, object valid, object now, object frame,
                   list new) except -1:
        """The bookkeeping of one message of ``s`` received at ``now``; a rate-tracked
        service's receive time is kept and it goes into ``new``."""
        self.updated[s] = True
        self.seen[s] = True
        self.log_mono_time[s] = mono
        self.valid[s] = valid
        self.recv_frame[s] = frame
        self.recv_time[s] = now
        tracked = self.tracked_of.get(s)
        if tracked is not None:
            (<tuple>tracked)[0].append(now)
            new.append(s)
        return 0

    cdef health(self, double cur_time, list new):
        """alive and freq_ok of every service at ``cur_time``; ``new``: the rate-tracked
        services that got a message in this update (their rate verdict changes)."""
        cdef dict seen = self.seen, alive_of = self.alive, freq_ok = self.freq_ok
        cdef dict rate_ok = self.rate_ok
        cdef double alive_s, expiry
        cdef bint ok, alive
        if self.simulation:
            for s in self.services:
                freq_ok[s] = True
                alive_of[s] = seen[s]
            return
        # A service that just got a message is alive and its rate verdict is new; one
        # that did not can only die, at its last message + alive_s: the whole pass runs
        # only once the earliest such time has come (or time went back).
        for s in new:
            times, recent, min_hz, max_hz, alive_s_obj = <tuple>self.tracked_of[s]
            alive_s = alive_s_obj
            ok = rate_in_band(times, recent, min_hz, max_hz)
            rate_ok[s] = ok
            alive_of[s] = True
            freq_ok[s] = ok
            expiry = cur_time + alive_s * (1 - 1e-9)
            if expiry < self.next_expiry:
                self.next_expiry = expiry
        if cur_time < self.next_expiry and cur_time >= self.last_health:
            self.last_health = cur_time
            return
        self.last_health = cur_time
        for s in self.untracked:
            freq_ok[s] = True
            alive_of[s] = True
        cdef dict recv_time = self.recv_time
        cdef double next_expiry = float("inf"), received
        for s, _, alive_s_obj in self.tracked:
            alive_s = alive_s_obj
            received = recv_time[s]
            alive = seen[s] and cur_time - received < alive_s
            alive_of[s] = alive
            freq_ok[s] = alive and rate_ok[s]
            if alive:
                # a little early, so that rounding never reports a dead service alive
                expiry = received + alive_s * (1 - 1e-9)
                if expiry < next_expiry:
                    next_expiry = expiry
        self.next_expiry = next_expiry
