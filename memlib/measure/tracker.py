"""The allocation tracker: every storage a training step allocates, as the CUDA caching allocator would count it.

:func:`AllocationTracker` records each storage as a :class:`Block` rounded as the allocator rounds it
(:func:`memlib.device.allocator.allocation`), with when it was allocated and freed, by which operation and in
which labelled window, so that ``memory_allocated`` and its peak can be read at every tick.  torch is
imported when the first tracker is made.  The allocator's rules it follows are in
``docs/derivations/measure_step.md``.
"""
from __future__ import annotations

import gc
import weakref

from ..device.allocator import allocation

__all__ = ["Block", "AllocationTracker"]


# ------------------------------------------------------------------------------------------------
# the tracker
# ------------------------------------------------------------------------------------------------
class Block:
    """One allocation: a storage's block from ``born`` (a clock tick) to ``died`` (None while alive)."""

    __slots__ = ("bytes", "nbytes", "born", "died", "op", "label", "window", "dtype", "shape", "kind", "owners",
                 "pending")

    def __init__(self, nbytes, born, op, label, window, dtype, shape):
        self.bytes = allocation(nbytes)
        self.nbytes = nbytes
        self.born, self.died = born, None
        self.op, self.label, self.window = op, label, window
        self.dtype, self.shape = dtype, shape
        self.kind = None        # set by the caller: "saved", "weight_grad", ...
        self.owners = 1         # storages sharing this block (a zero-copy storage swap)
        self.pending = False    # allocated inside a fused region, not counted (yet)

    def alive_at(self, tick: int) -> bool:
        return self.born <= tick and (self.died is None or self.died > tick)


class _Window:
    __slots__ = ("name", "start", "end", "peak", "tick", "label", "start_tick")

    def __init__(self, name, current, tick, label):
        self.name, self.start, self.end, self.start_tick = name, current, None, tick
        self.peak, self.tick, self.label = current, tick, label


def AllocationTracker(*, count_existing: bool = True, timeline: bool = True):  # noqa: N802
    """A new tracker (the class is built on first use, so that importing memlib does not import torch):
    ``count_existing`` counts the tensors alive when it starts as its baseline; ``timeline`` keeps the live
    bytes after every op."""
    return _tracker_class()(count_existing=count_existing, timeline=timeline)


_TRACKER_CLASS = None


def _tracker_class():
    global _TRACKER_CLASS
    if _TRACKER_CLASS is not None:
        return _TRACKER_CLASS
    import torch
    from torch.utils._pytree import tree_leaves
    from torch.utils._python_dispatch import TorchDispatchMode

    class _AllocationTracker(TorchDispatchMode):
        """Every storage allocated and freed while active, counted as CUDA caching-allocator blocks.

        ``current`` and ``peak`` are ``memory_allocated`` and ``max_memory_allocated``; ``blocks`` holds
        every block with the ticks it was born and died; :meth:`alive_at` lists what was alive at a tick;
        :meth:`window` opens a named interval whose own peak (and the tick of it) is kept, as
        ``reset_peak_memory_stats`` then ``max_memory_allocated`` would give; ``label`` is attached to
        what is allocated and to the timeline (one sample per op: ``timeline`` and ``labels``)."""

        def __init__(self, *, count_existing: bool = True, timeline: bool = True):
            super().__init__()
            self.count_existing = count_existing
            self.keep_timeline = timeline
            self.blocks: list[Block] = []
            self.live: dict[int, Block] = {}         # StorageImpl address -> its block
            self.current = self.peak = 0
            self.tick = self.peak_tick = 0
            self.baseline = 0
            self.label = ""
            self.ops = 0
            self.windows: list[_Window] = []
            self._window: _Window | None = None
            self.timeline: list[tuple[int, int, int]] = []  # (current after the op, label id, window index)
            self.labels: list[str] = []
            self._label_ids: dict[str, int] = {}
            self._finalizers: list = []
            self._fused: list[list[Block]] = []
            self._paused = 0
            self._resize = None

        # ---- entering and leaving -----------------------------------------------------------
        def __enter__(self):
            if self.count_existing:
                gc.collect()
                seen = set()
                for obj in gc.get_objects():
                    if issubclass(type(obj), torch.Tensor) and obj.device.type != "meta":
                        try:
                            s = obj.untyped_storage()
                        except (RuntimeError, NotImplementedError):
                            continue
                        if s._cdata not in seen and s._cdata not in self.live:
                            seen.add(s._cdata)
                            self._new(s, obj.dtype, obj.shape, "baseline", baseline=True)
                self.baseline = self.current
                self.peak = self.current
            tracker = self
            original = torch.UntypedStorage.resize_

            def resize_(storage, size):
                out = original(storage, size)
                if not tracker._paused:
                    tracker._resized(storage, "UntypedStorage.resize_")
                return out

            self._resize = original
            torch.UntypedStorage.resize_ = resize_
            return super().__enter__()

        def __exit__(self, *exc):
            torch.UntypedStorage.resize_ = self._resize
            for f in self._finalizers:
                f.detach()
            self._finalizers.clear()
            if self._window is not None:
                self._window.end = self.current
            return super().__exit__(*exc)

        # ---- the dispatch hook ----------------------------------------------------------------
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self._paused:
                return out
            self.ops += 1
            op = func.__name__ if hasattr(func, "__name__") else str(func)
            for x in tree_leaves(out):
                if isinstance(x, torch.Tensor):
                    self.see(x, op)
            if self.keep_timeline:
                self.timeline.append((self.current, self._label_id(), len(self.windows) - 1))
            return out

        def see(self, x, op: str = "") -> Block | None:
            """Count ``x``'s storage if it is new (or has been resized); its block."""
            if x.device.type == "meta":
                return None
            try:
                s = x.untyped_storage()
            except (RuntimeError, NotImplementedError):
                return None
            block = self.live.get(s._cdata)
            if block is None:
                return self._new(s, x.dtype, x.shape, op)
            if block.nbytes != s.nbytes() and block.owners == 1:
                return self._resized(s, op, x)
            return block

        # ---- bookkeeping ------------------------------------------------------------------------
        def _label_id(self) -> int:
            i = self._label_ids.get(self.label)
            if i is None:
                i = self._label_ids[self.label] = len(self.labels)
                self.labels.append(self.label)
            return i

        def _new(self, s, dtype, shape, op, baseline=False):
            self.tick += 1
            block = Block(s.nbytes(), self.tick, op, "baseline" if baseline else self.label,
                          self._window.name if self._window else "", str(dtype).replace("torch.", ""),
                          tuple(shape))
            self.blocks.append(block)
            self.live[s._cdata] = block
            self._finalizers.append(weakref.finalize(s, self._storage_died, s._cdata))
            if self._fused and not baseline:
                block.pending = True
                self._fused[-1].append(block)
            else:
                self._add(block.bytes)
            return block

        def _add(self, n):
            self.current += n
            if self.current > self.peak:
                self.peak, self.peak_tick = self.current, self.tick
            w = self._window
            if w is not None and self.current > w.peak:
                w.peak, w.tick, w.label = self.current, self.tick, self.label

        def _release(self, block):
            self.tick += 1
            block.died = self.tick
            if not block.pending:
                self.current -= block.bytes

        def _storage_died(self, key):
            block = self.live.pop(key, None)
            if block is None:
                return
            block.owners -= 1
            if block.owners == 0:
                self._release(block)

        def _resized(self, s, op, x=None):
            """A storage that changed size: its old block is freed, a new one allocated (CUDA's resize)."""
            key = s._cdata
            old = self.live.get(key)
            if old is None:
                if s.nbytes():
                    self._new(s, x.dtype if x is not None else torch.uint8, x.shape if x is not None else (s.nbytes(),),
                              op)
                return self.live.get(key)
            if old.nbytes == s.nbytes() and old.owners == 1:
                return old
            shape = old.shape
            dtype = old.dtype
            self.tick += 1
            block = Block(s.nbytes(), self.tick, op, self.label, self._window.name if self._window else "",
                          dtype, shape if x is None else tuple(x.shape))
            self.blocks.append(block)
            self.live[key] = block
            self._add(block.bytes)              # CUDA's resize allocates the new block, copies, frees the old
            old.owners -= 1
            if old.owners == 0:
                self._release(old)
            return block

        # ---- what callers use -------------------------------------------------------------------
        def window(self, name: str) -> None:
            """Close the current window and open ``name`` (its peak starts at what is allocated now)."""
            if self._window is not None:
                self._window.end = self.current
            self._window = _Window(name, self.current, self.tick, self.label)
            self.windows.append(self._window)

        def reset_peak(self) -> None:
            """``torch.cuda.reset_peak_memory_stats()``: the peak becomes what is allocated now."""
            self.peak, self.peak_tick = self.current, self.tick

        def alive_at(self, tick: int) -> list[Block]:
            """The blocks alive (counted) at ``tick``."""
            return [b for b in self.blocks if not b.pending and b.alive_at(tick)]

        def block_of(self, x) -> Block | None:
            """The block holding tensor ``x``'s storage (None if untracked)."""
            return self.live.get(x.untyped_storage()._cdata)

        def share(self, dst, src) -> None:
            """``dst``'s storage now points at ``src``'s data (a zero-copy storage swap): ``dst``'s own block
            is freed and ``src``'s lives until both storages are gone."""
            sd, ss = dst.untyped_storage(), src.untyped_storage()
            source = self.live.get(ss._cdata) or self.see(src, "share_storage")
            old = self.live.get(sd._cdata)
            if old is source:
                return
            if old is not None:
                old.owners -= 1
                if old.owners == 0:
                    self._release(old)
            else:
                self._finalizers.append(weakref.finalize(sd, self._storage_died, sd._cdata))
            source.owners += 1
            self.live[sd._cdata] = source

        def paused(self):
            """A context in which nothing is counted (the tracker's own bookkeeping, the CPU stand-ins)."""
            import contextlib

            @contextlib.contextmanager
            def cm():
                self._paused += 1
                try:
                    yield
                finally:
                    self._paused -= 1

            return cm()

        def fused(self, fn, *args, **kwargs):
            """Call ``fn`` as a fused (compiled) region: only what outlives it is allocated, when it returns."""
            self._fused.append([])
            try:
                out = fn(*args, **kwargs)
            finally:
                inside = self._fused.pop()
            for x in tree_leaves(out):
                if isinstance(x, torch.Tensor):
                    self.see(x, getattr(fn, "__name__", "fused"))
            for block in inside:
                if block.died is None and block.owners:
                    block.pending = False
                    self.tick += 1
                    block.born = self.tick
                    if self._fused:
                        block.pending = True
                        self._fused[-1].append(block)
                    else:
                        self._add(block.bytes)
            return out

    _TRACKER_CLASS = _AllocationTracker
    return _TRACKER_CLASS
