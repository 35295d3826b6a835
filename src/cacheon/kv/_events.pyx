# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The per-event work on a decoded batch, in C: the token arrays' form, the bounds, the index operations.

On the per-page wire (0.5.13.post1, the pin) every page is an event of its own, so what Python does
per event, not the decode, set the ingest rate. ``scan`` replaces a regex match and a bounds loop per
event with one pass; ``operations`` is ``cacheon.kv.wire.reference_operations`` op for op (tested so).
Neither decides a reject's reason: a batch ``scan`` flags goes to the Python paths that say why.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer

# ``scan``'s flags.
UNUSUAL_TOKENS = 1  # a token_ids that is not an array of u32s in the forms writers use: the typed decoder judges
PAST_BOUNDS = 2  # an event past a bound: WireDecoder._out_of_bounds names which


cdef Py_ssize_t _token_array(const unsigned char* p, Py_ssize_t n, bint* usual) noexcept:
    """The element count of a msgpack array's header at ``p`` (-1: not an array header), and whether
    the whole of ``p[:n]`` is that array of positive fixints, uint 8, uint 16 and uint 32."""
    cdef Py_ssize_t i, count
    usual[0] = False
    if n >= 1 and 0x90 <= p[0] <= 0x9f:
        count, i = p[0] & 0x0F, 1
    elif n >= 3 and p[0] == 0xDC:
        count, i = (<Py_ssize_t>p[1] << 8) | p[2], 3
    elif n >= 5 and p[0] == 0xDD:
        count = (<Py_ssize_t>p[1] << 24) | (<Py_ssize_t>p[2] << 16) | (<Py_ssize_t>p[3] << 8) | p[4]
        i = 5
    else:
        return -1
    while i < n:
        if p[i] < 0x80:
            i += 1
        elif p[i] == 0xCC:
            i += 2
        elif p[i] == 0xCD:
            i += 3
        elif p[i] == 0xCE:
            i += 5
        else:
            return count
    usual[0] = i == n
    return count


def token_array(raw):
    """(element count or -1, usual form) of one raw ``token_ids`` (for tests against the typed decoder)."""
    cdef Py_buffer view
    cdef bint usual
    PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE)
    try:
        count = _token_array(<const unsigned char*>view.buf, view.len, &usual)
    finally:
        PyBuffer_Release(&view)
    return count, usual


def scan(events, stored, Py_ssize_t max_block_size, Py_ssize_t max_tokens, Py_ssize_t max_pages):
    """``UNUSUAL_TOKENS | PAST_BOUNDS`` for a decoded batch's events (``stored``: the contract's BlockStored)."""
    cdef int flags = 0
    cdef Py_buffer view
    cdef bint usual
    cdef Py_ssize_t count
    for ev in events:
        if type(ev) is stored:
            PyObject_GetBuffer(ev.token_ids, &view, PyBUF_SIMPLE)
            count = _token_array(<const unsigned char*>view.buf, view.len, &usual)
            PyBuffer_Release(&view)
            if not usual:
                flags |= UNUSUAL_TOKENS
            if ev.block_size > max_block_size or count > max_tokens or len(ev.block_hashes) > max_pages:
                flags |= PAST_BOUNDS
        else:
            hashes = getattr(ev, "block_hashes", None)
            if hashes is not None and len(hashes) > max_pages:
                flags |= PAST_BOUNDS
    return flags


def operations(events, dict kinds, op_of, device_media, store, clear):
    """Index operations for decoded events and how many were skipped: ``reference_operations``' rules
    (``kinds``: event class -> operation, ``op_of`` filling it for a class not seen yet)."""
    ops = []
    current = tail = None
    run = None
    cdef Py_ssize_t skipped = 0
    for ev in events:
        kind = type(ev)
        op = kinds.get(kind)
        if op is None:
            op = op_of(kind)
        if op is clear:
            ops.append((clear, [], None))
            current = None
            continue
        if ev.medium not in device_media:
            skipped += 1
            continue
        hashes = ev.block_hashes
        if not hashes:
            continue
        if op is store:
            parent = ev.parent_block_hash
            if current is not store or parent is None or parent != tail:
                current, run = op, []
                ops.append((op, run, parent))
            tail = hashes[len(hashes) - 1]  # wraparound is off: no negative index
        elif current is not op:
            current, run = op, []
            ops.append((op, run, None))
        run.extend(hashes)
    return ops, skipped
