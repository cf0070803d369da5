// flight_sink.cpp — the flight recorder's chunk sink (ridgescope/flight.h).
//
// Each payload the Recorder hands over is decoded record by record, on the Recorder's writer
// thread. The records feed the step summarizer; a step record completes a step, whose summaries
// go out as records. With keep_steps == 0 the payload itself is written as it came (a full
// trace). Otherwise its records are sorted into three chunks: the definitions (strings, frames,
// stacks, metadata: always kept), the events, split at step boundaries so that each events
// chunk belongs to one step, and the summaries (always kept). Each events chunk begins with a
// time_base record (so it decodes without the chunks before it), and a step's first one with a
// checkpoint of the ledger. The file (flight_file.h) is rewritten without the steps the keep
// policy no longer keeps once enough of it is theirs.
#include <map>
#include <optional>
#include <stdexcept>

#include "absl/container/flat_hash_map.h"

#include "byte_codec.h"
#include "flight_file.h"
#include "keep_policy.h"
#include "record_codec.h"
#include "ridgescope/flight.h"
#include "step_summarizer.h"

namespace ridgescope {
namespace {

using detail::BlockLife;
using detail::FlightFile;
using detail::Resolved;

class FlightSink final : public ChunkSink {
 public:
  FlightSink(const std::string& path, const FlightOptions& options)
      : options_(options), file_(path), policy_(options.keep_steps, options.event_windows, options.keep_first_steps) {
    if (options_.keep_steps > 0) {
      summarizer_.on_ended = [this](const BlockLife& b, const Resolved& r) {
        if (watched_.contains(b.uid)) finals_[b.uid] = r;
      };
    }
  }
  ~FlightSink() override { close(); }

  const std::string& path() const noexcept override { return file_.path(); }
  std::string error() const override { return file_.error(); }
  ChunkSinkStats stats() const noexcept override { return file_.stats(); }

  bool write_chunk(std::string_view payload, std::uint32_t records) noexcept override {
    if (closed_ || failed_) return false;
    bool ok = false;
    try {
      ok = options_.keep_steps == 0 ? write_whole(payload, records) : write_sorted(payload);
    } catch (const std::exception& ex) {
      file_.set_error(std::string("the flight recorder failed: ") + ex.what());
    } catch (...) {
      file_.set_error("the flight recorder failed");
    }
    failed_ = !ok;
    return ok;
  }

  bool close() noexcept override {
    if (closed_) return !failed_;
    closed_ = true;
    bool ok = !failed_;
    try {
      if (ok) {
        // The step still running: its summaries so far (not complete).
        for (const StepSummary& s : summarizer_.open_summaries()) add_summary(s);
        ok = flush_buffers() && file_.flush();
        if (ok && options_.keep_steps > 0) ok = rewrite();
      }
    } catch (...) {
      file_.set_error("the flight recorder failed while closing");
      ok = false;
    }
    return file_.close() && ok;
  }

 private:
  struct Buffer {
    std::string bytes;
    std::uint32_t records = 0;
    void add(std::string_view record) {
      bytes.append(record);
      ++records;
    }
  };

  FlightFile::Keep keep() const {
    return [this](std::int64_t step) {
      return step == FlightFile::kKept || (step >= 0 && policy_.keeps(static_cast<std::uint64_t>(step)));
    };
  }

  // The blocks live at the end of a step kept for an event (a window may end there): their
  // final categories go after that window when the file is rewritten (Resolve records).
  struct EndList {
    struct Entry {
      std::uint64_t uid, addr;
      Device device;
    };
    std::vector<Entry> blocks;
  };

  void remember_end(std::uint64_t step) {
    EndList& list = ends_[step];
    list.blocks.clear();
    summarizer_.for_each_live([&](const BlockLife& b) {
      list.blocks.push_back({b.uid, b.addr, b.device});
      ++watched_[b.uid];
    });
  }

  void forget(EndList& list) {
    for (const auto& entry : list.blocks) {
      auto it = watched_.find(entry.uid);
      if (it != watched_.end() && --it->second == 0) {
        watched_.erase(it);
        finals_.erase(entry.uid);
      }
    }
    list.blocks.clear();
  }

  bool rewrite() {
    for (auto it = ends_.begin(); it != ends_.end();) {  // windows that are gone
      if (!policy_.keeps(it->first)) {
        forget(it->second);
        ends_.erase(it++);
      } else {
        ++it;
      }
    }
    return file_.rewrite(keep(), [this](std::int64_t last) {
      std::pair<std::string, std::uint32_t> out;
      auto it = ends_.find(static_cast<std::uint64_t>(last));
      if (it == ends_.end()) return out;
      for (const auto& entry : it->second.blocks) {
        auto f = finals_.find(entry.uid);
        std::optional<Resolved> r = f != finals_.end() ? std::optional<Resolved>(f->second)
                                                      : summarizer_.resolution_now(entry.device, entry.addr, entry.uid);
        if (!r) continue;
        detail::encode_resolve(entry.device, entry.addr, r->category, r->inferred ? kTagInferred : 0, r->label_id,
                               out.first);
        ++out.second;
      }
      return out;
    });
  }

  void add_summary(const StepSummary& s) {
    detail::encode_step_summary(s, summaries_.bytes);
    ++summaries_.records;
  }

  void on_step_completed(const Event& e) {
    auto& done = summarizer_.completed();
    policy_.on_step(e.value, done);
    if (options_.keep_steps > 0 && policy_.keeps_for_event(e.value)) remember_end(e.value);
    for (const StepSummary& s : done) add_summary(s);
    done.clear();
    ++steps_;
  }

  // Decodes the record at *pos; false at the end of the payload.
  bool next(std::string_view payload, std::size_t* pos, Event* e, std::string_view* record,
            std::uint64_t* before) {
    while (*pos < payload.size()) {
      const std::size_t start = *pos;
      *before = clock_.last_time_ns;
      const auto status = detail::decode_record(payload, pos, clock_, e, trace_format::kVersion, nullptr, &flight_);
      if (status == detail::DecodeStatus::Malformed) {
        throw std::runtime_error("a record the recorder encoded does not decode");
      }
      if (status == detail::DecodeStatus::UnknownKind) continue;
      *record = std::string_view(payload).substr(start, *pos - start);
      return true;
    }
    return false;
  }

  // keep_steps == 0: the payload as it came, then the summaries it completed.
  bool write_whole(std::string_view payload, std::uint32_t records) {
    std::size_t pos = 0;
    Event e;
    std::string_view record;
    std::uint64_t before = 0;
    while (next(payload, &pos, &e, &record, &before)) {
      summarizer_.on_event(e);
      if (e.kind == EventKind::Step) on_step_completed(e);
    }
    return file_.append(payload, records, FlightFile::kKept) && flush_buffers() && file_.flush();
  }

  bool write_sorted(std::string_view payload) {
    std::size_t pos = 0;
    Event e;
    std::string_view record;
    std::uint64_t before = 0;
    while (next(payload, &pos, &e, &record, &before)) {
      const auto kind = static_cast<std::uint8_t>(e.kind);
      if (e.kind == EventKind::String || e.kind == EventKind::Metadata || kind >= 64) {
        defs_.add(record);
      } else {
        if (events_.records == 0) {
          // The chain restarts, and a step's first chunk carries the state it starts from (the
          // summarizer's: it has not seen this event yet).
          detail::encode_time_base(before, events_.bytes);
          ++events_.records;
          events_step_ = summarizer_.current_step();
          if (new_step_ && steps_ > 0) {
            const std::size_t size = events_.bytes.size();
            summarizer_.write_checkpoint(before, events_.bytes);
            events_.records += count_records(events_.bytes, size);
          }
          new_step_ = false;
        }
        events_.add(record);
      }
      summarizer_.on_event(e);
      if (e.kind == EventKind::Step) {
        on_step_completed(e);
        if (!flush_buffers()) return false;  // the step's events chunk ends with its step record
        new_step_ = true;
      }
    }
    if (!flush_buffers() || !file_.flush()) return false;
    if (file_.rewrite_due(options_.rewrite_bytes, keep())) return rewrite();
    return true;
  }

  // Records appended to `bytes` from `from` on (each is a kind byte, a length and a payload).
  static std::uint32_t count_records(const std::string& bytes, std::size_t from) {
    std::uint32_t n = 0;
    std::size_t pos = from;
    while (pos < bytes.size()) {
      std::size_t p = pos + 1;
      std::uint64_t length = 0;
      if (!detail::get_varint(bytes, &p, &length)) break;
      pos = p + length;
      ++n;
    }
    return n;
  }

  // The definitions first (the events use them), then the events, then the summaries.
  bool flush_buffers() {
    bool ok = true;
    if (defs_.records > 0) ok = ok && file_.append(defs_.bytes, defs_.records, FlightFile::kKept);
    if (events_.records > 0) ok = ok && file_.append(events_.bytes, events_.records, static_cast<std::int64_t>(events_step_));
    if (summaries_.records > 0) ok = ok && file_.append(summaries_.bytes, summaries_.records, FlightFile::kKept);
    for (Buffer* b : {&defs_, &events_, &summaries_}) {
      b->bytes.clear();
      b->records = 0;
    }
    return ok;
  }

  const FlightOptions options_;
  FlightFile file_;
  detail::KeepPolicy policy_;
  detail::StepSummarizer summarizer_;
  detail::CodecClock clock_;
  detail::FlightPayload flight_;
  Buffer defs_, events_, summaries_;
  std::map<std::uint64_t, EndList> ends_;                      // by step
  absl::flat_hash_map<std::uint64_t, std::uint32_t> watched_;  // uid -> end lists holding it
  absl::flat_hash_map<std::uint64_t, Resolved> finals_;        // uid -> how its life ended
  std::uint64_t events_step_ = 0;
  std::uint64_t steps_ = 0;  // steps completed
  bool new_step_ = true;
  bool closed_ = false;
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<ChunkSink> make_flight_sink(const std::string& path, const FlightOptions& options) {
  return std::make_unique<FlightSink>(path, options);
}

}  // namespace ridgescope
