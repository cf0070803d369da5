// flight_compact.cpp — compact_trace (ridgescope/flight.h): a full trace re-recorded through the
// flight recorder's sink, record by record, with its own times and threads. Strings, frames and
// stacks are interned again in the order the trace defines them, so their ids are the trace's
// (and mapped where a trace's ids are not dense).
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "json_value.h"
#include "ridgescope/flight.h"
#include "ridgescope/recorder.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope {
namespace {

class IdMap {
 public:
  std::uint32_t operator()(std::uint32_t id) const {
    auto it = map_.find(id);
    return it == map_.end() ? 0 : it->second;
  }
  void set(std::uint32_t from, std::uint32_t to) { map_[from] = to; }

 private:
  absl::flat_hash_map<std::uint32_t, std::uint32_t> map_;
};

// The keep_first_steps of the recording that wrote `in` (its `flight` metadata, written when it
// started; 0 when it has none): the steps its saved-tensor hook ran in.
std::uint64_t recorded_first_steps(const std::string& in) {
  TraceReader reader(in);
  Event e;
  for (int i = 0; i < 4096 && reader.next(e); ++i) {
    if (e.kind != EventKind::Metadata || reader.string(e.string_id) != "flight") continue;
    std::string error;
    const auto v = detail::parse_json(e.text, &error);
    return v ? v->get_uint("keep_first_steps").value_or(0) : 0;
  }
  return 0;
}

}  // namespace

std::string flight_metadata(const FlightOptions& options) {
  return "{\"keep_steps\":" + (options.keep_steps == 0 ? std::string("null") : std::to_string(options.keep_steps)) +
         ",\"event_windows\":" + std::to_string(options.event_windows) +
         ",\"keep_first_steps\":" + std::to_string(options.keep_first_steps) + "}";
}

CompactResult compact_trace(const std::string& in, const std::string& out, const FlightOptions& given) {
  TraceReader reader(in);
  FlightOptions options = given;
  // The steps the recording's saved-tensor hook ran in stay kept, unless the caller says which.
  if (options.keep_first_steps == 0) options.keep_first_steps = recorded_first_steps(in);
  CompactResult result;
  result.in_bytes = reader.file_bytes();
  Recorder recorder(make_flight_sink(out, options));
  IdMap strings, frames, stacks;
  std::vector<std::uint32_t> frame_ids;
  Event e;
  while (reader.next(e)) {
    ++result.events;
    switch (e.kind) {
      case EventKind::String:
        strings.set(e.string_id, recorder.intern(e.text));
        break;
      case EventKind::Metadata:
        recorder.metadata(reader.string(e.string_id), e.text);
        break;
      case EventKind::Frame: {
        FrameRecord f = reader.frame(e.string_id);
        f.file_id = strings(f.file_id);
        f.function_id = strings(f.function_id);
        f.module_id = strings(f.module_id);
        frames.set(e.string_id, recorder.intern_frame(f));
        break;
      }
      case EventKind::Stack: {
        const StackView s = reader.stack(e.string_id);
        frame_ids.clear();
        for (std::uint32_t i = 0; i < s.size; ++i) frame_ids.push_back(frames(s.frames[i]));
        stacks.set(e.string_id, recorder.intern_stack(frame_ids.data(), frame_ids.size(), s.site));
        break;
      }
      case EventKind::StepSummary:
        break;  // the sink summarises the events again
      case EventKind::Checkpoint:
      case EventKind::CheckpointBlock:
      case EventKind::CheckpointSegment:
      case EventKind::CheckpointExternal:
      case EventKind::Resolve:
        recorder.close();
        std::remove(out.c_str());  // nothing of it is worth keeping
        throw std::runtime_error("'" + in + "' is a bounded trace (it keeps some steps only): only a full trace "
                                 "(keep_steps all) can be compacted");
      default:
        if (static_cast<std::uint8_t>(e.kind) >= 64) break;
        e.string_id = strings(e.string_id);
        e.stack_id = stacks(e.stack_id);
        recorder.record_timed(e);
        if (e.kind == EventKind::Step) ++result.steps;
        break;
    }
  }
  result.truncated = reader.truncated();
  recorder.metadata("flight", flight_metadata(options));
  recorder.close();
  if (recorder.failed()) throw std::runtime_error(recorder.error());
  result.out_bytes = recorder.stats().file_bytes;
  return result;
}

}  // namespace ridgescope
