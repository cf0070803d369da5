"""The model of PyTorch's CUDA caching allocator (csrc/core/allocator_model.cpp) from Python.

It turns a sequence of requests and frees into the blocks, segments, allocated and reserved
bytes torch's native allocator would have, without a GPU: ``rs.estimate`` uses it to predict
reserved memory, and :func:`simulate` replays a recorded run under other settings ("what if I
set ``expandable_segments:True`` on this run?"). What is modelled exactly and what is
approximated: docs/fit.md, "The allocator model".

Settings are ``PYTORCH_CUDA_ALLOC_CONF`` strings; a malformed one raises RidgescopeError with
the parser's message. Sizes accept ints (bytes) or strings like ``"80GiB"``."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import _C
from ._errors import RidgescopeError, TraceFormatError
from ._format import parse_bytes


def _capacity(capacity: "int | str | None") -> int:
    if capacity is None or capacity == 0:
        return 0
    try:
        return parse_bytes(capacity)
    except ValueError as exc:
        raise RidgescopeError(f"capacity: {exc}") from None


def _settings_error(exc: ValueError) -> RidgescopeError:
    return RidgescopeError(str(exc))


def parse_alloc_conf(alloc_conf: str) -> dict[str, Any]:
    """The settings a PYTORCH_CUDA_ALLOC_CONF string gives, as a dict (``alloc_conf`` is the
    canonical form: only the options that differ from torch's defaults)."""
    try:
        return _C.parse_alloc_conf(alloc_conf)
    except ValueError as exc:
        raise _settings_error(exc) from None


def round_size(nbytes: int, alloc_conf: str = "") -> int:
    """The block size torch's CUDA caching allocator gives a request of ``nbytes`` (round_size:
    512-byte multiples, or roundup_power2_divisions steps when configured)."""
    try:
        return _C.allocator_round_size(int(nbytes), alloc_conf)
    except ValueError as exc:
        raise _settings_error(exc) from None


class AllocatorModel:
    """One device's caching allocator, modelled. Single-threaded (use it from one thread).

    ``malloc`` returns a dict: ``ok``, ``status`` ("ok", "out_of_memory", "duplicate_id"),
    ``block_bytes``, ``address`` (synthetic, deterministic), ``segment_bytes`` (newly
    reserved), ``released_bytes`` (cached memory freed to make room), ``segment_created``,
    ``small_pool``. ``capacity`` is the device memory the allocator may reserve (None:
    unlimited, no OOM)."""

    def __init__(self, alloc_conf: str = "", capacity: "int | str | None" = None) -> None:
        try:
            self._m = _C.AllocatorModel(alloc_conf, _capacity(capacity))
        except ValueError as exc:
            raise _settings_error(exc) from None

    def malloc(self, alloc_id: int, nbytes: int, stream: int = 0) -> dict[str, Any]:
        return self._m.malloc(int(alloc_id), int(nbytes), int(stream))

    def free(self, alloc_id: int) -> bool:
        """Frees a live allocation; False for an unknown id."""
        return self._m.free(int(alloc_id))

    def empty_cache(self) -> int:
        """torch.cuda.empty_cache(): the bytes released."""
        return self._m.empty_cache()

    def reset_peaks(self) -> None:
        self._m.reset_peaks()

    def stats(self) -> dict[str, int]:
        return self._m.stats()

    def segments(self) -> list[dict[str, Any]]:
        """The segments with the keys of torch.cuda.memory_snapshot()["segments"]."""
        return self._m.segments()

    @property
    def settings(self) -> dict[str, Any]:
        return self._m.settings()

    @property
    def allocated_bytes(self) -> int:
        return self._m.allocated_bytes

    @property
    def reserved_bytes(self) -> int:
        return self._m.reserved_bytes

    @property
    def peak_allocated_bytes(self) -> int:
        return self._m.peak_allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self._m.peak_reserved_bytes

    @property
    def segment_count(self) -> int:
        return self._m.segment_count

    def hint_next_segment_address(self, address: int) -> None:
        """Places the next segment this model creates at ``address`` (a recorded segment's
        address) if it overlaps no live segment; the hint expires with the next malloc."""
        self._m.hint_next_segment_address(int(address))

    def release_cached_segment(self, address: int) -> int:
        """Releases the wholly free cached segment at ``address`` (or unmaps the whole free
        pages of the expandable block there), as a recorded release did; the bytes released."""
        return self._m.release_cached_segment(int(address))

    def record_segment_events(self, enabled: bool = True) -> None:
        self._m.record_segment_events(enabled)

    def segment_events(self) -> list[dict[str, Any]]:
        return self._m.segment_events()


def simulate(path: "str | os.PathLike[str]", alloc_conf: str = "",
             capacity: "int | str | None" = None, *, timeline_points: int = 512,
             device: "int | str | None" = None, keep_segment_events: bool = False,
             use_recorded_segment_addresses: bool = False) -> dict[str, Any]:
    """Replays a ridgescope trace's alloc/free events through the allocator model with the
    given settings. Returns a dict: ``peak_allocated_bytes``, ``peak_reserved_bytes``,
    ``segment_count`` (at the end), ``recorded_peak_bytes`` (peak of the recorded block bytes),
    ``failed_allocs`` (requests the capacity could not hold), ``timeline`` (at most
    ``timeline_points`` buckets, each with its highest allocated and reserved bytes), ``final``
    (all counters), ``settings``.

    ``device``: None = the first CUDA device in the trace (else the CPU events), "cpu", or a
    CUDA index. The request replayed is the event's requested bytes.
    ``use_recorded_segment_addresses``: place the model's segments at the trace's segment
    addresses (to reproduce a run with the settings it had; not for a what-if)."""
    p = Path(path)
    if not p.is_file():
        raise TraceFormatError(f"cannot read {p}: no such file")
    if device is None:
        dev = -2
    elif device == "cpu":
        dev = -1
    elif isinstance(device, int) and device >= 0:
        dev = device
    else:
        raise RidgescopeError(f"device must be None, 'cpu' or a CUDA index, got {device!r}")
    if timeline_points < 0:
        raise RidgescopeError(f"timeline_points must be >= 0, got {timeline_points}")
    try:
        return _C.simulate_allocator(str(p), alloc_conf, _capacity(capacity), timeline_points,
                                     dev, keep_segment_events, use_recorded_segment_addresses)
    except _C.TraceError as exc:
        raise TraceFormatError(str(exc)) from None
    except ValueError as exc:
        raise _settings_error(exc) from None


def replay_actions(actions: Iterable[Sequence[Any]], alloc_conf: str = "",
                   capacity: "int | str | None" = None, *,
                   timeline_points: int = 0) -> dict[str, Any]:
    """Replays ``(action, address, nbytes, stream)`` tuples through a fresh model, e.g. the
    ``alloc`` / ``free_completed`` entries of a torch snapshot's ``device_traces`` (action is
    "alloc", "free", "free_completed" or "empty_cache"; "segment_alloc" or "segment_map" places
    the next segment the model creates at the recorded address, so that best-fit ties between
    equal blocks fall as in the recorded run; "segment_free" or "segment_unmap" releases the
    model's cached segment, or unmaps the free pages, at that address). The result is
    :func:`simulate`'s dict
    plus ``segment_events``, the segment changes the model made (``segment_alloc``,
    ``segment_free``, ``segment_map``, ``segment_unmap``) with ``reserved_after`` each, to be
    compared with the snapshot's own segment entries. Timeline indices are action indices."""
    rows = []
    for i, a in enumerate(actions):
        if len(a) != 4:
            raise RidgescopeError(f"action {i}: expected (action, address, nbytes, stream), got {a!r}")
        rows.append((str(a[0]), int(a[1]), int(a[2]), int(a[3])))
    try:
        return _C.replay_allocator_actions(rows, alloc_conf, _capacity(capacity),
                                           timeline_points, True)
    except ValueError as exc:
        raise _settings_error(exc) from None


_SEGMENT_ACTIONS = ("segment_alloc", "segment_map", "segment_free", "segment_unmap")


def actions_from_snapshot(snapshot: dict[str, Any], device: int = 0, *,
                          segment_addresses: bool = True) -> list[tuple[str, int, int, int]]:
    """The alloc/free sequence of a torch memory snapshot (``torch.cuda.memory._snapshot()``
    dict with ``device_traces``), for :func:`replay_actions`.

    With ``segment_addresses`` (the default), the segment entries are kept: segment_alloc /
    segment_map place the model's next segment at the recorded address, segment_free /
    segment_unmap release the model's cached segment (or free pages) at that address, so every
    release torch made (empty_cache, release-and-retry, garbage collection) is replayed as it
    happened. Without it, a run of segment_free / segment_unmap entries not followed by the
    segment_alloc / segment_map / oom of a retried request becomes an "empty_cache" action (an
    empty_cache directly followed by a request that makes a new segment is then taken for a
    retry). Blocks live before the trace began are ignored (their frees count as unmatched)."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or device >= len(traces):
        raise TraceFormatError(f"the snapshot has no device_traces for device {device}")
    entries = traces[device]
    out: list[tuple[str, int, int, int]] = []
    i = 0
    while i < len(entries):
        e = entries[i]
        action = e.get("action")
        if action == "alloc":
            out.append(("alloc", int(e["addr"]), int(e["size"]), int(e.get("stream", 0))))
        elif action == "free_completed":
            out.append(("free", int(e["addr"]), int(e["size"]), int(e.get("stream", 0))))
        elif action in _SEGMENT_ACTIONS and segment_addresses:
            out.append((action, int(e["addr"]), int(e["size"]), int(e.get("stream", 0))))
        elif action in ("segment_free", "segment_unmap"):
            # A release inside malloc's retry is followed by the segment_alloc/map or oom of
            # the same request; a release by empty_cache is not.
            j = i
            while j < len(entries) and entries[j].get("action") in ("segment_free", "segment_unmap"):
                j += 1
            follower = entries[j].get("action") if j < len(entries) else None
            if follower not in ("segment_alloc", "segment_map", "oom"):
                out.append(("empty_cache", 0, 0, 0))
            i = j
            continue
        i += 1
    return out


_SEGMENT_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def compare_with_snapshot(snapshot: dict[str, Any], device: int = 0,
                          alloc_conf: "str | None" = None,
                          capacity: "int | str | None" = None) -> dict[str, Any]:
    """Replays a torch memory snapshot's alloc/free sequence through the model and compares
    the model's segment changes with the recorded ones, one by one (issue 7, item 2).

    The settings are the snapshot's ``allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]`` unless
    ``alloc_conf`` is given; ``capacity`` (None: unlimited) matters only if the run released
    cached memory to retry a request. The snapshot must cover the run from its first CUDA
    allocation. Returns a dict: ``recorded_segment_events`` and ``model_segment_events``
    (counts), ``matching_prefix`` (how many agree in action, bytes and reserved bytes after),
    ``exact`` (all agree), ``first_mismatch`` (index, recorded, model; None when exact),
    ``recorded_peak_reserved_bytes`` / ``model_peak_reserved_bytes``,
    ``recorded_segment_count`` (segments in the snapshot) / ``model_segment_count``, and the
    replay's ``unmatched_frees`` and ``failed_allocs``."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or device >= len(traces):
        raise TraceFormatError(f"the snapshot has no device_traces for device {device}")
    if alloc_conf is None:
        settings = snapshot.get("allocator_settings") or {}
        alloc_conf = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
    recorded = []
    reserved = 0
    for e in traces[device]:
        sign = _SEGMENT_SIGN.get(e.get("action"))
        if sign is None:
            continue
        reserved += sign * int(e["size"])
        recorded.append((e["action"], int(e["size"]), reserved))
    r = replay_actions(actions_from_snapshot(snapshot, device), alloc_conf, capacity)
    model = [(e["action"], e["bytes"], e["reserved_after"]) for e in r["segment_events"]]
    prefix = 0
    while prefix < min(len(recorded), len(model)) and recorded[prefix] == model[prefix]:
        prefix += 1
    exact = prefix == len(recorded) == len(model)
    mismatch = None
    if not exact:
        mismatch = {"index": prefix,
                    "recorded": recorded[prefix] if prefix < len(recorded) else None,
                    "model": model[prefix] if prefix < len(model) else None}
    segments = [s for s in snapshot.get("segments", []) if int(s.get("device", device)) == device]
    return {
        "alloc_conf": alloc_conf,
        "recorded_segment_events": len(recorded),
        "model_segment_events": len(model),
        "matching_prefix": prefix,
        "exact": exact,
        "first_mismatch": mismatch,
        "recorded_peak_reserved_bytes": max((x[2] for x in recorded), default=0),
        "model_peak_reserved_bytes": r["peak_reserved_bytes"],
        "recorded_reserved_bytes": sum(int(s["total_size"]) for s in segments),
        "model_reserved_bytes": r["final"]["reserved_bytes"],
        "recorded_segment_count": len(segments),
        "model_segment_count": r["segment_count"],
        "unmatched_frees": r["unmatched_frees"],
        "failed_allocs": r["failed_allocs"],
    }
