// ridgescope/report.h — what a run's memory did: the peak and its composition, per-step and
// per-phase statistics, the largest blocks at the peak, OOMs and warnings. Produced by
// analyze_trace() (ridgescope/analysis.h) from a trace file; serialised by report_to_json()
// with the schema documented in docs/report_schema.md.
//
// All byte figures are integer bytes; all times are nanoseconds since the session started.
// Thread-safety: plain data.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ridgescope/category.h"
#include "ridgescope/event.h"
#include "ridgescope/forensics.h"
#include "ridgescope/ledger.h"
#include "ridgescope/run_glance.h"
#include "ridgescope/memory_layers.h"
#include "ridgescope/stack.h"

namespace ridgescope {

inline constexpr int kReportSchemaVersion = 1;

using CategoryBytes = std::array<std::uint64_t, kCategoryCount>;  // bytes, by category index

struct TopBlock {
  std::uint64_t bytes = 0;
  Category category = Category::Unknown;
  bool inferred = false;         // category came from a lifetime rule, not a direct signal
  std::string label;             // e.g. "layers.3.mlp.fc1.weight"
  std::string phase_allocated;   // innermost phase at allocation ("idle" outside any)
  std::string module;            // module running at allocation ("" when none or unknown)
  std::uint64_t step_allocated = 0;
  std::uint64_t address = 0;
  std::string site;              // where it was made (docs/sites.md); "" when none was recorded
  std::int64_t site_frame = -1;  // index into Report::frames; -1 when none
};

// --- Allocation sites (docs/sites.md) --------------------------------------------------------
// A frame the report refers to (the peak's sites and stacks, the retained-tensor verdict), once
// each in Report::frames.
struct ReportFrame {
  FrameKind kind = FrameKind::Untracked;
  std::string file;       // Python: the source file; native: the shared library
  std::uint64_t line = 0;  // 1-based; 0 when none
  std::string function;   // Python: the (qualified) function; autograd: the node; untracked: why
  std::string module;     // autograd frames: the module whose forward made the node
  // Decided by the core for every consumer (docs/sites.md, "Library frames"):
  bool library = false;   // library code (torch, the standard library, native frames, ...), not the user's
  std::string text;       // as a person reads it, the file's base name: "model.py:50 in MLPBlock.forward"
  std::string location;   // the same with the whole path: "/home/me/model.py:50 in MLPBlock.forward"
};

// Bytes live at the peak that were made at one site, in one category.
struct SiteBytes {
  std::int64_t frame = -1;  // index into Report::frames; -1: no site recorded
  std::string site;         // "train.py:10 in train", "MmBackward0 of layers.3.mlp.fc1"
  Category category = Category::Unknown;
  std::uint64_t bytes = 0;
  std::uint64_t blocks = 0;
};

// Bytes live at the peak that were made by one stack. Together the stacks cover every block
// live at the peak: their bytes sum to PeakInfo::bytes.
struct StackBytes {
  std::vector<std::uint32_t> frames;  // indices into Report::frames, innermost first ([]: none)
  std::int64_t site = -1;             // position of the site in frames; -1 when none
  std::uint64_t bytes = 0;
  std::uint64_t blocks = 0;
  CategoryBytes by_category{};
};

// Bytes that stay live from step to step and grow at every step end in the steady state: a
// tensor kept across steps (docs/sites.md, "Retained tensors").
struct RetainedSite {
  std::int64_t frame = -1;          // index into Report::frames; -1: no site recorded
  std::string site;
  Category category = Category::Unknown;  // category at allocation
  std::uint64_t growth_per_step_bytes = 0;  // average over the window (exact when constant)
  std::uint64_t bytes = 0;          // live at the last step end
  std::uint64_t blocks = 0;
};

struct RetainedGrowth {
  std::uint64_t since_step = 0;     // the first step whose end shows the growth
  std::uint64_t last_step = 0;      // the last complete step
  std::uint64_t growth_steps = 0;   // step ends in the window, each with more bytes than the last
  std::uint64_t growth_per_step_bytes = 0;  // total over the sites, average per step end
  bool growth_constant = false;     // every step end of the window grew by exactly that much
  std::uint64_t min_growth_bytes = 0, max_growth_bytes = 0;
  std::uint64_t bytes = 0, blocks = 0;  // live at the growing sites at the last step end
  std::vector<RetainedSite> sites;  // largest growth first
  std::int64_t latest = -1;         // index into sites: the site made last in the final step
  Verdict verdict;                  // kind "retained_tensors": why, and what to change
};

struct LabelBytes {
  std::string label;
  Category category = Category::Unknown;
  std::uint64_t bytes = 0;   // bytes live at the peak under this label
  std::uint64_t blocks = 0;  // number of such blocks
};

struct PeakInfo {
  std::uint64_t bytes = 0;           // live (allocated) bytes at the peak
  std::uint64_t reserved_bytes = 0;  // reserved bytes at that instant
  std::uint64_t step = 0;
  std::string phase = "idle";        // innermost phase at the peak
  std::vector<std::string> phase_stack;  // outermost first
  std::uint64_t time_ns = 0;
  std::uint64_t seq = 0;             // event sequence number at which the peak was reached
  CategoryBytes by_category{};
  CategoryBytes inferred_by_category{};  // part of by_category assigned by lifetime rules
  std::vector<TopBlock> top_blocks;  // largest first
  FreeSpace free;                    // the cache's free space at the peak (empty on CPU)
  std::vector<LabelBytes> by_label;  // largest first
  // `parameter` and `buffer` bytes by label, every label (not in the JSON: the per-model
  // figures of ModelSummary::models are summed from it)
  std::vector<LabelBytes> persistent_labels;
  std::vector<SiteBytes> by_site;    // largest first (AnalysisOptions::top_sites)
  std::vector<StackBytes> stacks;    // largest first; all of the peak (AnalysisOptions::max_stacks)
  std::uint64_t stacks_merged = 0;   // stacks beyond max_stacks, merged into one entry without frames
};

struct PhaseStats {
  std::string phase;
  std::string parent;                // enclosing phase ("" at top level)
  std::uint32_t depth = 0;           // 0 for a top-level phase
  std::uint64_t step = 0;
  std::uint32_t index = 0;           // occurrence of this phase name within its step (0, 1, ...)
  bool complete = true;              // false when the trace ended inside the phase
  std::uint64_t begin_time_ns = 0, end_time_ns = 0;
  std::uint64_t start_bytes = 0, end_bytes = 0, peak_bytes = 0;
  std::uint64_t peak_time_ns = 0;
  std::uint64_t allocated_bytes = 0;  // sum of blocks allocated during the phase
  std::uint64_t freed_bytes = 0;      // sum of blocks freed during the phase
  std::uint64_t allocations = 0;
  CategoryBytes start_by_category{}, peak_by_category{}, end_by_category{};
};

struct StepStats {
  std::uint64_t step = 0;
  bool complete = true;  // false for a trailing step the trace never closed
  // From the first thing that happened in the step to its `step` record (or the trace's end).
  std::uint64_t begin_time_ns = 0, end_time_ns = 0;
  std::uint64_t start_bytes = 0, end_bytes = 0, peak_bytes = 0;
  CategoryBytes peak_by_category{}, end_by_category{};
  std::vector<PhaseStats> phases;  // in order of their beginning
};

struct OomRecord {
  std::uint64_t request_bytes = 0;
  std::uint64_t device_free_bytes = 0;
  std::uint64_t step = 0;
  std::string phase = "idle";
  std::uint64_t time_ns = 0;
  std::uint64_t live_bytes = 0, reserved_bytes = 0;
  CategoryBytes by_category{};
  FreeSpace free;    // the cache's free space at the failure
  Verdict verdict;   // why, and what to change
};

// What dashboards that sample memory periodically would have drawn for this run.
struct SamplerView {
  std::uint64_t period_ns = 0;
  std::uint64_t samples = 0;
  std::uint64_t max_sample_bytes = 0;  // the highest sample: what the dashboard calls the peak
};

// Live bytes over time, downsampled for drawing: the run's time span [0, end_time_ns] is cut
// into columns of column_ns nanoseconds (at most AnalysisOptions::timeline_columns), and each
// column keeps the lowest and highest live bytes it saw, so no peak is hidden: the report's
// peak.bytes is exactly the max_bytes of the column holding peak.time_ns. A column with no
// event carries the state from before it. Size is bounded by the column count, not the trace.
struct TimelineColumn {
  std::uint64_t changes = 0;                   // state changes observed in the column
  std::uint64_t min_bytes = 0, max_bytes = 0;  // live bytes, lowest and highest in the column
  std::uint64_t max_time_ns = 0;               // when max_bytes was first reached in it
  std::uint64_t reserved_bytes = 0;            // highest reserved bytes in the column
  CategoryBytes max_by_category{};             // composition at max_time_ns (sums to max_bytes)
};

struct TimelinePhase {
  std::string phase;
  std::uint64_t step = 0;
  std::uint32_t depth = 0;  // 0 for a top-level phase
  std::uint64_t begin_time_ns = 0, end_time_ns = 0;
};

struct Timeline {
  std::uint64_t end_time_ns = 0;  // the last event's time; the timeline starts at 0
  std::uint64_t column_ns = 1;    // column i covers [i * column_ns, (i + 1) * column_ns)
  std::vector<TimelineColumn> columns;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> step_ends;  // (step, time of its record)
  std::vector<TimelinePhase> phases;                             // in order of beginning
  std::vector<std::uint64_t> oom_times_ns;
  // Spans whose events a bounded trace did not keep (docs/long-runs.md): (from, to) nanoseconds,
  // from the last event of one kept window to the checkpoint that starts the next.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> gaps;
};

struct ReportWarning {
  std::string kind;     // stable identifier, e.g. "lazy_optimizer_state"
  std::string message;  // plain language
  std::uint64_t bytes = 0;
  std::uint64_t step = 0;
};

struct ConsistencyCheck {
  std::uint64_t samples = 0;     // allocator live-byte readings compared with the ledger
  std::uint64_t mismatches = 0;  // readings that disagreed
  std::int64_t first_difference_bytes = 0;  // ledger minus allocator at the first mismatch
  std::uint64_t first_mismatch_seq = 0;
};

struct TraceInfo {
  std::string path;
  std::uint64_t file_bytes = 0;
  std::uint32_t format_version = 0;
  std::uint64_t events = 0;
  std::uint64_t skipped_records = 0;  // records of kinds this version does not know
  bool truncated = false;
  std::uint64_t truncated_at = 0;     // byte offset where usable data ends
  std::string problem;
  std::uint64_t duration_ns = 0;
};

// What the run's `run` metadata says about the process (absent fields stay empty).
struct RunSummary {
  std::string ridgescope_version, torch_version, python_version;
  std::vector<std::string> argv;
};

// The model header: what the model is and the persistent bytes per trainable parameter its
// dtypes and optimizer imply, next to what was measured. Counts and bytes come from the `run`
// metadata; where it has none, parameter_bytes is the measured `parameter` bytes.
// One model of the run: the tracked one, and every other the script held (an EMA copy, a
// frozen reference model or teacher, a frozen encoder), as the Python layer described it, with
// the bytes the analysis measured under its labels at the peak.
struct ModelListEntry {
  std::string name;          // the variable or attribute holding it, else class and creation site
  std::string class_name;
  std::string found;         // how: "tracked", "called", "variable", "attribute", "element",
                             // "created", "collection"
  std::string created_at;    // "train.py:9", "" when not known
  std::string label_prefix;  // its labels start with this ("" for the tracked model)
  std::string copy_of;       // a collection of tensors copying this model's parameters, or ""
  bool trainable = false;    // whether any of its parameters requires a gradient
  std::uint64_t parameters = 0, parameter_tensors = 0, trainable_parameters = 0;  // counts
  std::uint64_t parameter_bytes = 0, trainable_parameter_bytes = 0;  // bytes, from its tensors
  std::uint64_t buffers = 0, buffer_bytes = 0;                       // count, bytes
  std::vector<std::pair<std::string, std::uint64_t>> dtypes;  // dtype -> parameter tensors
  std::vector<std::string> devices;
  std::uint64_t peak_parameter_bytes = 0, peak_buffer_bytes = 0;  // measured at the peak, bytes
};

struct ModelSummary {
  std::string class_name;                       // "" when unknown
  std::optional<std::uint64_t> parameters, parameter_tensors;           // counts
  std::optional<std::uint64_t> trainable_parameters, trainable_parameter_tensors;
  std::uint64_t parameter_bytes = 0;
  std::optional<std::uint64_t> trainable_parameter_bytes;
  std::optional<std::uint64_t> buffers, buffer_bytes;
  std::vector<std::pair<std::string, std::uint64_t>> dtypes;  // dtype -> parameter tensors
  // (parameter + gradient + optimizer state) bytes per trainable parameter: implied by the
  // dtypes and the optimizer's states per parameter, and measured at the end of the last
  // complete optimizer step (then measured_at_step is set).
  std::optional<double> expected_persistent_bytes_per_parameter;
  std::optional<double> measured_persistent_bytes_per_parameter;
  std::optional<std::uint64_t> measured_at_step;
  std::vector<ModelListEntry> models;  // every model, the tracked one first (when known)
};

struct OptimizerSummary {
  std::string type;                             // class name; "" when unknown
  std::uint64_t state_bytes = 0;                // optimizer_state at the end of the last
                                                // complete optimizer step (else at the end)
  std::optional<std::uint64_t> states_per_parameter;
  std::vector<std::string> state_keys;
  std::string hyperparameters_json = "{}";      // a JSON object, re-serialised after parsing
  std::uint64_t steps = 0;                      // optimizer_step phases seen
};

// The driver's view of the device (NVML samples), reconciled with the allocator's reserved bytes.
struct DriverView {
  std::optional<bool> available;      // whether the run had NVML (unknown: not asked)
  std::string reason;                 // why not, when it had none
  std::uint64_t samples = 0;
  std::uint64_t total_bytes = 0;      // device memory, as NVML reports it
  std::uint64_t max_used_bytes = 0;   // device-wide used memory, the highest sample
  std::uint64_t max_non_pytorch_bytes = 0;  // used minus reserved, the highest sample
  std::uint64_t process_samples = 0;         // samples of this process's own usage
  std::uint64_t max_process_used_bytes = 0;  // this process's usage, the highest sample
};

// ridgescope's own cost, from the `session` metadata written when tracking stopped.
struct RecorderSummary {
  bool known = false;
  std::uint64_t events = 0, dropped_events = 0;  // counts
  std::uint64_t bytes_written = 0, buffer_bytes_peak = 0;
};

// How strong the evidence behind a snapshot's inferred category is, strongest first
// (SnapshotReason::evidence; docs/snapshot.md, "How sure the categories are"): the snapshot names
// the category, a frame of the block's stack does, the step's structure does (lifetimes across
// the phases, sizes matched within the step, the step repeated), size or lifetime alone does, or
// nothing does (unknown).
inline constexpr std::array<std::string_view, 5> kSnapshotEvidence = {"recorded", "frames", "structure", "weak",
                                                                      "none"};
// How each evidence reads in a sentence ("12.5% by frames"), in kSnapshotEvidence's order; the
// report carries it (snapshot.confidence.evidence_text) for the text and HTML reporters.
inline constexpr std::array<std::string_view, 5> kSnapshotEvidenceText = {
    "recorded in the snapshot", "by frames", "by the step's structure", "by size or lifetime alone",
    "by nothing (unknown)"};

// Why the blocks of a snapshot PyTorch wrote have their categories: one inference rule and what
// decided it (docs/snapshot.md lists the rules), with the bytes it holds.
struct SnapshotReason {
  std::string rule;      // stable rule id, e.g. "parameter_matched_gradient"
  Category category = Category::Unknown;
  std::string reason;    // plain language with the deciding frame, e.g. "allocated under
                         // torch/optim/adamw.py _init_group"
  std::string evidence;  // how strong: "recorded", "frames", "structure", "weak" (size or lifetime
                         // alone) or "none" (unknown); docs/snapshot.md
  std::uint64_t allocations = 0;  // blocks decided so
  std::uint64_t peak_bytes = 0;   // of them, bytes live at the peak (all reasons sum to peak.bytes)
  std::uint64_t peak_blocks = 0;
  std::uint64_t end_bytes = 0;    // bytes live at the end (all reasons sum to final_live_bytes)
};

// One device of a snapshot, replayed on its own (the per-device summary).
struct SnapshotDevice {
  std::string device;                   // "cuda:1"
  std::uint64_t segments = 0;           // segments of this device in the snapshot
  std::uint64_t trace_entries = 0;      // its device_traces entries
  std::uint64_t peak_bytes = 0;         // live bytes at its peak
  std::uint64_t peak_reserved_bytes = 0;
  CategoryBytes peak_by_category{};
  std::uint64_t end_live_bytes = 0;     // the sum of its segments' allocated_size
  std::uint64_t end_reserved_bytes = 0; // the sum of its segments' total_size
};

// Where a report built from a torch memory snapshot (ridgescope/snapshot.h) got what it says:
// PyTorch's snapshots hold addresses, sizes, times and stack frames but no categories or
// phases, so those are inferred (docs/snapshot.md). Absent for reports of ridgescope traces.
struct SnapshotImport {
  std::string producer;            // "ridgescope" (an export of a trace) or "pytorch"
  int protocol = 0;                // pickle protocol (2..4)
  std::string device;              // the device replayed ("cuda:0", "cpu")
  std::uint64_t trace_entries = 0;          // device_traces entries replayed
  std::uint64_t live_at_start_blocks = 0;   // blocks live before the first entry (segments or
                                            // frees without an alloc)
  bool categories_inferred = false;  // from stack frames and lifetimes, not recorded
  bool phases_inferred = false;      // from stack frames, not recorded
  bool block_sizes_inferred = false; // block bytes recomputed from requested sizes
  std::uint64_t block_sizes_modelled = 0;       // allocations sized by replaying the segments
  std::uint64_t blocks_larger_than_rounded = 0; // of those, handed a whole unsplit block
  std::uint64_t unmatched_entries = 0;          // entries the segment replay could not place
  std::string alloc_conf;            // allocator_settings["PYTORCH_CUDA_ALLOC_CONF"] ("" if none)
  std::uint64_t categorised_from_snapshot = 0;  // allocations whose entry named a category
  std::uint64_t categorised_from_frames = 0;    // allocations a frame rule categorised
  std::vector<std::string> notes;    // plain-language caveats
  std::vector<SnapshotReason> reasons;  // PyTorch's snapshots: why each byte has its category,
                                        // largest at the peak first
  std::vector<SnapshotDevice> devices;  // every device with segments or trace entries
  std::string device_choice;            // "asked" (a device was named) or "highest_peak"
};

struct Report {
  int schema_version = kReportSchemaVersion;
  TraceInfo trace;
  Device device;
  std::vector<Device> devices_seen;
  std::optional<std::uint64_t> device_capacity_bytes;  // when known (the run's metadata)
  PeakInfo peak;
  std::vector<StepStats> steps;
  std::vector<OomRecord> ooms;
  std::vector<ReportWarning> warnings;
  ConsistencyCheck consistency;
  std::vector<SamplerView> dashboards;  // 15 s and 30 s samplers, next to peak.bytes
  Timeline timeline;                    // live bytes over time, for charts
  // The state at AnalysisOptions::probe_time_ns, when asked for.
  struct Probe {
    std::uint64_t time_ns = 0;
    std::uint64_t live_bytes = 0, reserved_bytes = 0;
    FreeSpace free;
  };
  std::optional<Probe> probe;
  LedgerAnomalies anomalies;
  std::uint64_t allocations = 0, frees = 0, tags = 0;
  std::uint64_t final_live_bytes = 0;
  std::uint64_t final_reserved_bytes = 0;  // reserved bytes when the trace ends
  CategoryBytes final_by_category{};
  std::vector<std::pair<std::string, std::string>> metadata;  // key -> JSON text, in order
  RunSummary run;
  ModelSummary model;
  OptimizerSummary optimizer;
  RecorderSummary recorder;
  DriverView driver_view;
  std::optional<SnapshotImport> snapshot;  // set when built from a torch memory snapshot
  std::vector<ReportFrame> frames;         // frames the sites, stacks and verdicts refer to
  std::optional<RetainedGrowth> retained;  // set when bytes kept across steps grow
  RunGlance glance;                        // every step summarised (ridgescope/run_glance.h)
  // The two ledgers beside the composition (ridgescope/memory_layers.h): the process's resident
  // set in three layers (set when the trace has host samples) and, for a CUDA device, the
  // driver's figure reconciled with reserved bytes and the allocations outside PyTorch.
  std::optional<HostMemoryReport> host_memory;
  std::optional<DeviceLedgerReport> device_ledger;

  // The report as JSON (docs/report_schema.md), and written to a file (throws
  // std::runtime_error naming the path when it cannot be written).
  std::string to_json() const;
  void write_json(const std::string& path) const;
};

// Serialises a report as JSON (docs/report_schema.md); the same as report.to_json(). Metadata
// the analysis understands (`run`, `session`) becomes the run, model, optimizer and recorder
// sections; other keys are emitted as JSON strings holding the recorded text, never spliced in.
std::string report_to_json(const Report& report);

// "cpu", "cuda:0".
std::string device_name(Device device);

}  // namespace ridgescope
