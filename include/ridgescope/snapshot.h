// ridgescope/snapshot.h — PyTorch memory snapshots (torch.cuda.memory._snapshot() pickles):
// export a ridgescope trace as one, and read one (also one PyTorch wrote) into a Report.
//
// Export: write_snapshot() writes the format PyTorch's own tools read (pytorch.org/memory_viz,
// python -m torch.cuda._memory_viz): a protocol 4 pickle of plain dict/list/tuple/str/int/
// float/bool/None only, with `segments` (and their `blocks`) at the end of the trace,
// `device_traces` (one list per device; every entry carries a `category` so memory_viz colours
// allocations by ridgescope's category, and `unknown` is always among them), `allocator_settings`,
// phases and steps as `external_annotations`, and per allocation the phase, label, module and
// step in `user_metadata`. A CPU trace becomes device 0, one segment per block
// (allocated == reserved). Layout and keys: docs/snapshot.md.
//
// Import: analyze_snapshot() reads a pickle with a restricted unpickler (never Python's
// pickle; no object is ever constructed, see docs/snapshot.md for the limits), replays it as
// ridgescope events and runs the normal analysis, so the Report has the usual structure plus
// Report::snapshot saying what was inferred: for PyTorch's own snapshots categories and phases
// come from stack frames and lifetimes; for ridgescope's exports they are read back.
//
// Thread-safety: every function is reentrant and shares no state between calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ridgescope/analysis.h"
#include "ridgescope/event.h"
#include "ridgescope/report.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope {

// A snapshot that cannot be read (not a pickle, a refused opcode, wrong types, missing keys,
// a length field past the end). The message names the problem; offset() is the byte offset
// for problems in the pickle itself, 0 for problems in its content.
class SnapshotError : public TraceError {
 public:
  using TraceError::TraceError;
};

struct SnapshotWriteOptions {
  // The device to export. Default: every CUDA device in the trace; the CPU when the trace has
  // no CUDA allocations.
  std::optional<Device> device;
};

struct SnapshotWriteStats {
  std::uint64_t trace_entries = 0;  // entries in device_traces, all devices
  std::uint64_t allocations = 0;    // alloc entries
  std::uint64_t segments = 0;       // segments live at the end
  std::uint64_t annotations = 0;    // external_annotations (phase begin/end, steps)
  std::uint64_t outside_allocations = 0;  // allocations outside PyTorch, exported as their own
                                          // segments (category non_pytorch)
  std::uint64_t bytes = 0;          // size of the pickle
};

// Writes the trace at `trace_path` as a snapshot pickle at `out_path`. Throws TraceError when
// the trace cannot be read and std::runtime_error naming the path when the output cannot be
// written. A truncated trace exports its readable prefix.
SnapshotWriteStats write_snapshot(const std::string& trace_path, const std::string& out_path,
                                  const SnapshotWriteOptions& options = {});

// A user category rule (`ridgescope report --rules rules.toml`): a block whose allocation stack
// has a frame matching both regular expressions (ECMAScript syntax, matched anywhere in the
// frame's function name and file; an empty one matches everything) gets `category`, before
// any built-in rule. Rules are tried in order; the first that matches wins.
struct SnapshotCategoryRule {
  std::string name;        // shown in the reason ("user rule 'attention' matched ...")
  Category category = Category::Unknown;
  std::string frame_name;  // regular expression over frame (function) names; "" matches any
  std::string file;        // regular expression over frame files; "" matches any
};

struct SnapshotReadOptions {
  // The CUDA device (device_traces index, segments' `device`) to replay. Default: of the
  // devices with segments or trace entries, the one whose live bytes peak highest.
  std::optional<int> device_index;
  // User category rules, applied before the built-in inference (PyTorch's snapshots only).
  std::vector<SnapshotCategoryRule> rules;
};

// Converts a snapshot pickle into a ridgescope trace at `trace_path` (the events the trace
// reader produces) and returns what was inferred. Throws SnapshotError.
SnapshotImport snapshot_to_trace(const std::string& pickle_path, const std::string& trace_path,
                                 const SnapshotReadOptions& options = {});

// Reads a snapshot pickle and analyses it like a trace: the Report's trace.path is the pickle
// and Report::snapshot says what was inferred. Throws SnapshotError.
Report analyze_snapshot(const std::string& pickle_path, const AnalysisOptions& analysis = {},
                        const SnapshotReadOptions& options = {});

// True when the file starts like a pickle of protocol 2 or later (byte 0x80).
bool looks_like_pickle(const std::string& path);

}  // namespace ridgescope
