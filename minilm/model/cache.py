"""Preallocated per-layer key/value cache that knows its own length.

``cache.length`` is the number of tokens the model has been given so far, and so the
absolute position of the next one: prefill writes positions 0..P-1, decode step t writes
P+t. Keys are stored after rotation (RoPE; except for sinks at cache positions, below),
together with the position of every slot, so attention masks and biases are built from real
positions, never from slice lengths.

A ``rolling`` cache is a ring buffer of ``capacity`` slots: once full, each new token
overwrites the oldest one (slot = position mod capacity), which gives sliding-window
attention over the last ``capacity`` positions with absolute positions kept. A chunk of up to
``capacity`` tokens may pass the end of the ring (a long prompt, prefilled in chunks): its
queries see the keys held before it together with its own (``update`` hands attention both,
and the mask by positions keeps each query's window), and only then do its keys overwrite the
oldest slots. With sinks, or static, a cache that has wrapped takes one token at a time.

With ``sinks`` = N > 0 (attention sinks, Xiao et al. 2023, "Efficient Streaming Language
Models with Attention Sinks") the first N slots keep positions 0..N-1 for good and the ring
is the other capacity - N slots (slot = N + (position - N) mod (capacity - N)): every query
sees the first N tokens and the last capacity - N. ``sink_positions`` says where attention
places them: ``absolute``, at their own positions (a query at 10,000 sees the sinks 10,000
back), or ``cache``, at their positions within the cache as the paper does (its section 3.2:
sinks 0..N-1, the window after them, the query last; ``minilm.model.attention.attend_in_cache``).
For ``cache`` the keys are stored before rotation, so that they can be rotated at their
cache positions at every step.

With ``offsets`` the rows are left-padded prompts of different lengths: row b's first token
sits in slot offsets[b], so its position is the slot's minus offsets[b], and the padding before
it, at negative positions, is hidden from the row's tokens (``minilm.model.attention.row_layout``).

A ``static`` cache always hands attention all ``capacity`` slots, the empty ones at position
``EMPTY`` (after every query, so the causal mask hides them): every decode step then has the
same shapes, which is what a compiled step needs (``minilm.generation.compiled``, as in gpt-fast).

Per layer (``model.layers``, ``minilm.positions.layers``), a layer that can only see the last W
keys (a sliding window W, or chunks of W) keeps a ring of its own of W slots in place of the
cache's capacity, so a 5:1 local/global model holds about a sixth of the keys at a long context.
Layers of one capacity share one ``Ring`` (the slots' positions and the pass in progress). A
layer's own ring takes a chunk of any length: attention sees the keys held before the chunk with
all of the chunk's, and the ring keeps the chunk's last W.
"""

from __future__ import annotations

import torch

EMPTY = float(2**24)  # the position of an empty slot: later than any query
SINK_POSITIONS = ("cache", "absolute")  # where attention places the sinks (see above); the first is the default


def check_sink_positions(value, error: type = ValueError) -> str:
    """``value`` when it is one of ``SINK_POSITIONS``; else ``error`` naming it and those."""
    if value not in SINK_POSITIONS:
        raise error(f"sink_positions={value!r} is invalid: expected one of {', '.join(SINK_POSITIONS)}")
    return value


def cache_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype of a KV cache for a model with this ``weight``: float32 for bf16/fp16 weights on
    the CPU (where attention then runs in float32, faster there: docs/design.md, "Measured
    choices"), else the weights' own. The values are the same: a bf16 key is exact in float32."""
    if weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return weight.dtype


class Ring:
    """The token slots of one capacity that some layers share: each slot's position (``EMPTY`` until
    written) and the slots of the forward pass in progress. ``own``: a layer's own window, which
    takes a chunk of any length (the module docstring)."""

    def __init__(self, capacity: int, *, rolling: bool, sinks: int, static: bool, own: bool, device):
        self.capacity, self.rolling, self.sinks, self.static, self.own = capacity, rolling, sinks, static, own
        self.slot_pos = torch.full((capacity,), EMPTY, dtype=torch.float32, device=device)
        self.pending = None  # the slots of the forward pass in progress: an int for one token, else a tensor
        self.before = None  # a chunk that wraps the ring: (held slots, their positions, the chunk's positions)

    def rewind(self) -> None:
        self.slot_pos.fill_(EMPTY)
        self.pending = self.before = None

    def begin(self, length: int, positions: torch.Tensor) -> None:
        """Reserve the slots of the new tokens at ``positions`` (length, length + 1, ...)."""
        num_new, end = len(positions), length + len(positions)
        wraps = self.rolling and num_new > 1 and end > self.capacity
        if wraps and not self.own and (self.sinks or self.static or num_new > self.capacity):
            raise ValueError(
                f"a rolling cache takes chunks of at most its capacity ({self.capacity}), and with sinks "
                f"or static one token at a time, once it wraps: got {num_new} tokens at position "
                f"{length}"
            )
        if wraps:  # the keys held now stay visible to this chunk's queries (module docstring)
            held = min(length, self.capacity)
            self.before = (held, self.slot_pos[:held].clone(), positions)
            positions = positions[-self.capacity :]  # what the ring keeps of the chunk
        if num_new == 1 and not self.static:  # a decode step: its slot is a Python int (a compiled step takes tensors)
            slot = self.slot_of(length)
            self.slot_pos[slot] = length
            self.pending = slot
            return
        index = positions.long()
        if self.sinks:
            ring = self.capacity - self.sinks
            slots = torch.where(index < self.capacity, index, self.sinks + (index - self.sinks) % ring)
        else:
            slots = index % self.capacity
        self.slot_pos[slots] = positions
        self.pending = slots

    def slot_of(self, position: int) -> int:
        """The slot that holds ``position``: the position itself until the ring is full; then in a
        rolling ring the oldest slot (after the sinks)."""
        if position < self.capacity:
            return position
        return self.sinks + (position - self.sinks) % (self.capacity - self.sinks)


class KVCache:
    """The keys and values of every layer for ``batch_size`` rows, with the position of every
    slot and ``length``, the tokens given so far (the module docstring). ``update(layer, k, v)``
    writes a pass's keys and returns what attention reads: (keys, values, their positions).
    ``n_head`` and ``head_dim`` size each layer's store (the KV heads), ``capacity`` its slots,
    ``rolling`` a ring of them (a window), ``sinks`` the first positions kept for good, placed by
    ``sink_positions``; ``static`` fixes every shape (a compiled step's), ``offsets`` (one count
    per row) are left-padded rows, ``spans`` per layer the most recent keys it can see. Bad
    settings raise ValueError. Made by ``new_cache`` (``minilm.model.gpt``)."""

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_head: int,
        head_dim: int,
        capacity: int,
        *,
        rolling: bool = False,
        sinks: int = 0,
        sink_positions: str = SINK_POSITIONS[0],
        static: bool = False,
        offsets=None,
        dtype=torch.float32,
        device=None,
        spans=None,
    ):
        """``spans``: per layer, the most recent keys it can see (``LayerType.cache_span``; None: all)."""
        if capacity < 1:
            raise ValueError(f"cache capacity={capacity} is invalid: expected at least 1 token")
        if not 0 <= sinks < capacity:
            raise ValueError(f"sinks={sinks} is invalid for capacity {capacity}: expected 0 <= sinks < capacity")
        check_sink_positions(sink_positions)
        # keys kept unrotated and renumbered at every step (attention sinks at cache positions)
        self.renumbered = rolling and sinks > 0 and sink_positions == "cache"
        if static and self.renumbered:
            raise ValueError("a static cache keeps absolute positions: it takes sink_positions='absolute' only")
        self.offsets = None  # left-padded rows: row b's position = slot position - offsets[b]
        if offsets is not None:
            offsets = torch.as_tensor(offsets, dtype=torch.float32, device=device)
            if offsets.shape != (batch_size,) or bool((offsets < 0).any()):
                raise ValueError(f"offsets must hold one count >= 0 per row ({batch_size}), got {offsets.tolist()}")
            if static or sinks:
                raise ValueError("left-padded rows (offsets) take neither a static cache nor attention sinks")
            self.offsets = offsets
        self.capacity, self.rolling, self.batch_size, self.sinks = capacity, rolling, batch_size, sinks
        self.sink_positions = sink_positions
        self.static = static
        main = Ring(capacity, rolling=rolling, sinks=sinks, static=static, own=False, device=device)
        self.rings = {capacity: main}
        self.layer_rings = []
        for span in spans or [None] * n_layer:
            size = capacity if span is None else min(span, capacity)
            if size not in self.rings:
                self.rings[size] = Ring(size, rolling=True, sinks=0, static=static, own=True, device=device)
            self.layer_rings.append(self.rings[size])
        self.keys = [
            torch.zeros((batch_size, n_head, ring.capacity, head_dim), dtype=dtype, device=device)
            for ring in self.layer_rings
        ]
        self.values = [torch.zeros_like(keys) for keys in self.keys]
        self.length = 0  # tokens seen = position of the next token

    @property
    def slot_pos(self) -> torch.Tensor:
        """The positions of the cache's own slots (capacity): those of every layer without a ring of its own."""
        return self.rings[self.capacity].slot_pos

    def capacity_of(self, layer: int) -> int:
        """The slots ``layer`` keeps: the cache's capacity, or its own window's."""
        return self.layer_rings[layer].capacity

    def nbytes(self) -> int:
        """The bytes of every layer's keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def rewind(self) -> None:
        """Empty the cache (its memory kept), to be filled again from position 0."""
        for ring in self.rings.values():
            ring.rewind()
        self.length = 0

    def begin(self, num_new: int) -> torch.Tensor:
        """Reserve slots for ``num_new`` tokens at positions length..length+num_new-1; return them."""
        end = self.length + num_new
        if not self.rolling and end > self.capacity:
            raise ValueError(
                f"KV cache full: it holds {self.length} of {self.capacity} positions and cannot take "
                f"{num_new} more; allocate new_cache(..., capacity>={end}) or a rolling cache"
            )
        positions = torch.arange(self.length, end, device=self.slot_pos.device, dtype=torch.float32)
        for ring in self.rings.values():
            ring.begin(self.length, positions)
        return positions

    def slot_of(self, position: int) -> int:
        """The slot of the cache's own ring that holds ``position`` (``Ring.slot_of``)."""
        return self.rings[self.capacity].slot_of(position)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write this layer's new keys/values; return all held keys, values and their positions."""
        ring = self.layer_rings[layer]
        slots, keys, values = ring.pending, self.keys[layer], self.values[layer]
        if ring.static and ring.before is None:
            # every slot, the empty ones included: nothing for a compiler to guard on
            keys.index_copy_(2, slots, k.to(keys.dtype))
            values.index_copy_(2, slots, v.to(values.dtype))
            return keys, values, ring.slot_pos
        if isinstance(slots, int):  # a decode step: a plain slice write is cheapest
            keys[:, :, slots] = k[:, :, 0]
            values[:, :, slots] = v[:, :, 0]
            n = min(self.length + 1, ring.capacity)
        elif ring.before is not None:  # held keys and the chunk's, before the chunk overwrites the oldest
            held, held_pos, positions = ring.before
            k, v = k.to(keys.dtype), v.to(values.dtype)
            out = torch.cat([keys[:, :, :held], k], 2), torch.cat([values[:, :, :held], v], 2)
            keys.index_copy_(2, slots, k[:, :, -len(slots) :])
            values.index_copy_(2, slots, v[:, :, -len(slots) :])
            return (*out, torch.cat([held_pos, positions]))
        else:
            keys.index_copy_(2, slots, k.to(keys.dtype))
            values.index_copy_(2, slots, v.to(values.dtype))
            n = min(self.length + len(slots), ring.capacity)
        return keys[:, :, :n], values[:, :, :n], ring.slot_pos[:n]

    def commit(self) -> None:
        """Advance the length once every layer has written its keys."""
        pending = self.rings[self.capacity].pending
        self.length += 1 if isinstance(pending, int) else len(pending)
        for ring in self.rings.values():
            ring.pending = ring.before = None
