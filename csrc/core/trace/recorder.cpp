#include "ridgescope/recorder.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "byte_codec.h"
#include "page_arena.h"
#include "record_codec.h"
#include "ridgescope/clock.h"
#include "ridgescope/trace_format.h"

namespace ridgescope {
namespace {

// A small, stable number per thread for the event's `thread` field (1, 2, ...): a
// zero-initialised thread_local numbered on first use, so that every record makes one TLS
// access, where a thread_local with a dynamic initialiser is reached through its guard too.
thread_local std::uint32_t t_thread_number = 0;
std::uint32_t this_thread_number() noexcept {
  static std::atomic<std::uint32_t> next{1};
  std::uint32_t& number = t_thread_number;
  if (number == 0) number = next.fetch_add(1, std::memory_order_relaxed);
  return number;
}

#if defined(__linux__)
int set_thread_policy(int tid, int policy) noexcept {
  sched_param param{};
  param.sched_priority = 0;
  return sched_setscheduler(tid, policy, &param);
}
#endif

}  // namespace

namespace {
RecorderOptions clamp(RecorderOptions o) {
  // Chunks must stay readable: well under the readers' limit, and never empty.
  if (o.chunk_bytes > trace_format::kMaxChunkBytes / 4) o.chunk_bytes = trace_format::kMaxChunkBytes / 4;
  if (o.chunk_bytes == 0) o.chunk_bytes = 1;
  if (o.flush_interval_ms == 0) o.flush_interval_ms = 1;
  return o;
}
}  // namespace

Recorder::Recorder(const std::string& path, RecorderOptions options)
    : Recorder(make_file_sink(path), options) {}

Recorder::Recorder(std::unique_ptr<ChunkSink> sink, RecorderOptions options)
    : sink_(std::move(sink)),
      options_(clamp(options)),
      origin_ns_(monotonic_now_ns()),
      current_(new_chunk()),
      strings_(std::make_unique<detail::InternTable>()),
      frames_(std::make_unique<detail::InternTable>()),
      stacks_(std::make_unique<detail::InternTable>()) {
  writer_ = std::thread([this] { writer_loop(); });
}

Recorder::~Recorder() { close(); }

Recorder::ChunkBytes Recorder::new_chunk() const {
  ChunkBytes chunk(detail::page_mappings());
  chunk.reserve(options_.chunk_bytes + 1024);
  return chunk;
}

void Recorder::record(const Event& event) noexcept {
  const std::uint32_t thread = this_thread_number();
  std::unique_lock<std::mutex> lock(mutex_);
  // The clock is read under the lock so that times never go backwards in the stream.
  append_locked(event, monotonic_now_ns() - origin_ns_, thread);
  wait_for_room(lock);
}

void Recorder::record_timed(const Event& event) noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  append_locked(event, event.time_ns, event.thread);
  wait_for_room(lock);
}

void Recorder::wait_for_room_slow(std::unique_lock<std::mutex>& lock) noexcept {
  // Wait for the writer rather than grow without limit. Waiting here, this thread writes the
  // oldest chunk itself whenever no one is writing one.
  while (queue_.size() > options_.max_queued_chunks && !failed_ && !closed_ && !closing_) {
    if (!write_front_locked(lock)) written_.wait(lock);
  }
}

std::uint32_t Recorder::intern(std::string_view text) noexcept {
  if (text.empty()) return 0;
  std::unique_lock<std::mutex> lock(mutex_);
  try {
    if (const std::uint32_t known = strings_->find(text)) return known;
    const auto id = static_cast<std::uint32_t>(strings_->size() + 1);
    strings_->add(text, id);
    Event e;
    e.kind = EventKind::String;
    e.string_id = id;
    e.text = text;
    append_locked(e, 0, 0);
    wait_for_room(lock);
    return id;
  } catch (...) {
    fail_locked("out of memory while interning a string");
    return 0;
  }
}

std::uint32_t Recorder::intern_frame(const FrameText& f) noexcept {
  FrameRecord r;
  r.kind = f.kind;
  r.line = f.line;
  r.file_id = intern(f.file);
  r.function_id = intern(f.function);
  r.module_id = intern(f.module);
  return intern_frame(r);
}

std::uint32_t Recorder::intern_frame(const FrameRecord& r) noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  try {
    std::string key;
    detail::put_varint(key, static_cast<std::uint64_t>(r.kind));
    detail::put_varint(key, r.file_id);
    detail::put_varint(key, r.line);
    detail::put_varint(key, r.function_id);
    detail::put_varint(key, r.module_id);
    if (const std::uint32_t known = frames_->find(key)) return known;
    const auto id = static_cast<std::uint32_t>(frames_->size() + 1);
    frames_->add(key, id);
    std::string record;
    detail::encode_frame_record(id, r, record);
    append_definition_locked(record);
    wait_for_room(lock);
    return id;
  } catch (...) {
    fail_locked("out of memory while interning a frame");
    return 0;
  }
}

std::uint32_t Recorder::intern_stack(const std::uint32_t* frames, std::size_t count,
                                     std::uint32_t site) noexcept {
  if (count == 0) return 0;
  if (count > kMaxStackFrames) count = kMaxStackFrames;  // the innermost frames come first
  if (site > count) site = static_cast<std::uint32_t>(count);
  std::unique_lock<std::mutex> lock(mutex_);
  try {
    std::string key;
    detail::put_varint(key, site);
    for (std::size_t i = 0; i < count; ++i) detail::put_varint(key, frames[i]);
    if (const std::uint32_t known = stacks_->find(key)) return known;
    const auto id = static_cast<std::uint32_t>(stacks_->size() + 1);
    stacks_->add(key, id);
    std::string record;
    detail::encode_stack_record(id, frames, count, site, record);
    append_definition_locked(record);
    wait_for_room(lock);
    return id;
  } catch (...) {
    fail_locked("out of memory while interning a stack");
    return 0;
  }
}

// An encoded frame or stack record (untimed), appended like any other record.
void Recorder::append_definition_locked(const std::string& record) {
  if (failed_ || closed_ || closing_) {
    ++stats_.dropped_events;
    return;
  }
  if (current_.size() + record.size() > trace_format::kMaxChunkBytes) hand_off_locked();
  if (current_.empty()) current_started_ns_ = monotonic_now_ns();
  const std::size_t capacity = current_.capacity();
  current_.append(record);
  ++current_records_;
  ++stats_.events;
  if (current_.capacity() != capacity) note_held_locked();  // a record longer than the room left
  if (current_.size() >= options_.chunk_bytes) hand_off_locked();
}

// The recorder's buffers now: the queued chunks, the one being filled, the written ones kept.
// An empty string's capacity is its inline storage, not a buffer on the heap.
std::uint64_t Recorder::held_locked() const noexcept {
  const std::uint64_t current = current_.capacity() > ChunkBytes().capacity() ? current_.capacity() : 0;
  return queued_bytes_ + current + spare_bytes_;
}

void Recorder::note_held_locked() noexcept {
  const std::uint64_t held = held_locked();
  if (held > stats_.buffer_bytes_peak) stats_.buffer_bytes_peak = held;
}

void Recorder::metadata(std::string_view key, std::string_view json) noexcept {
  const std::uint32_t key_id = intern(key);
  std::unique_lock<std::mutex> lock(mutex_);
  Event e;
  e.kind = EventKind::Metadata;
  e.string_id = key_id;
  e.text = json;
  append_locked(e, 0, 0);
  wait_for_room(lock);
}

void Recorder::append_locked(const Event& event, std::uint64_t time_ns, std::uint32_t thread) {
  // After close() began nothing more is accepted: the writer is draining its last chunk.
  if (failed_ || closed_ || closing_) {
    ++stats_.dropped_events;
    return;
  }
  // A record that would not fit in a chunk a reader accepts is refused (counted as dropped).
  if (event.text.size() > kMaxRecordBytes) {
    ++stats_.dropped_events;
    return;
  }
  try {
    if (current_.size() + event.text.size() + 64 > trace_format::kMaxChunkBytes) hand_off_locked();
    if (current_.empty()) current_started_ns_ = monotonic_now_ns();
    const std::size_t capacity = current_.capacity();
    detail::CodecClock clock{codec_time_ns_};
    detail::encode_record(event, detail::RecordStamp{time_ns, thread}, clock, current_);
    codec_time_ns_ = clock.last_time_ns;
    ++current_records_;
    ++stats_.events;
    // What the buffers hold changes only when the chunk grows or is handed off (which notes it).
    if (current_.capacity() != capacity) note_held_locked();
    if (current_.size() >= options_.chunk_bytes) hand_off_locked();
  } catch (...) {
    fail_locked("out of memory while recording an event");
  }
}

void Recorder::hand_off_locked() {
  if (current_records_ == 0) return;
  queued_bytes_ += current_.size();
  queue_.emplace_back(std::move(current_), current_records_);
  if (!spare_.empty()) {  // a written chunk's buffer: no allocation on the recording thread
    current_ = std::move(spare_.back());
    spare_.pop_back();
    spare_bytes_ -= std::min<std::uint64_t>(spare_bytes_, current_.capacity());
  } else {
    current_ = new_chunk();
  }
  current_records_ = 0;
  note_held_locked();
  wake_writer_.notify_one();
}

// Writes the oldest queued chunk on this thread, unless one is being written: chunks reach the
// sink in order, one at a time, from whichever thread takes them (the writer, or one that waits
// for it). The lock is released during the write. Returns whether a chunk was written.
bool Recorder::write_front_locked(std::unique_lock<std::mutex>& lock) {
  if (queue_.empty() || writing_) return false;
  auto chunk = std::move(queue_.front());
  queue_.pop_front();
  writing_ = true;
  const bool inject = inject_failure_;
  inject_failure_ = false;
  lock.unlock();
  const bool ok = !inject && sink_->write_chunk(chunk.first, chunk.second);
  std::string reason;
  if (!ok) {
    try {
      reason = inject ? "cannot write the trace file '" + sink_->path() + "': injected write failure"
                      : sink_->error();
    } catch (...) {
      reason = "cannot write the trace file";
    }
  }
  lock.lock();
  writing_ = false;
  // fail_locked() (from any thread, while the lock was released) zeroes the count.
  queued_bytes_ -= std::min<std::uint64_t>(queued_bytes_, chunk.first.size());
  if (!ok) {
    stats_.dropped_events += chunk.second;  // this chunk's records never reached the file
    if (!failed_) fail_locked(std::move(reason));
  }
  if (spare_.size() < kSpareChunks && chunk.first.capacity() >= options_.chunk_bytes) {
    chunk.first.clear();  // kept for the next hand-off, its memory with it
    try {
      spare_.push_back(std::move(chunk.first));
      spare_bytes_ += spare_.back().capacity();
      note_held_locked();  // a kept buffer counts its capacity, the queue counted its size
    } catch (...) {
    }
  }
  written_.notify_all();
  if (!queue_.empty()) wake_writer_.notify_one();
  return true;
}

void Recorder::writer_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
#if defined(__linux__)
  writer_tid_ = static_cast<int>(syscall(SYS_gettid));
  // Named, so that `top -H`, py-spy and perf tell it from the training threads.
  pthread_setname_np(pthread_self(), kWriterThreadName);
  // Not once close() has begun: it returns the writer to the normal class to exit promptly.
  if (options_.idle_writer && !closing_) set_thread_policy(0, SCHED_IDLE);  // refused: stays normal
#endif
  for (;;) {
    // The predicate keeps a notify() that came before this wait (a close() right after the
    // thread started) from being lost for a whole interval.
    wake_writer_.wait_for(lock, std::chrono::milliseconds(options_.flush_interval_ms), [this] {
      return closing_ || (!queue_.empty() && !writing_ && !writer_paused_);
    });
    if (current_records_ > 0 &&
        (closing_ || monotonic_now_ns() - current_started_ns_ >=
                         std::uint64_t{options_.flush_interval_ms} * 1000000u)) {
      hand_off_locked();
    }
    while (!writer_paused_ && write_front_locked(lock)) {  // each write notifies its waiters
    }
    // What is still queued (another thread is writing it, or the writer is paused) is close()'s.
    if (closing_ && current_records_ == 0) return;
  }
}

void Recorder::flush() noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  if (closed_) return;
  hand_off_locked();
  while (!((queue_.empty() && !writing_) || failed_ || closed_)) {
    if (!write_front_locked(lock)) written_.wait(lock);
  }
}

void Recorder::close() noexcept {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_ || closing_) return;
    closing_ = true;
    hand_off_locked();
    wake_writer_.notify_one();
    // The chunks left are written here, unless the writer is writing one (then waited for), so
    // that closing never waits for an idle writer to be given time.
    while (!queue_.empty() && !failed_) {
      if (!write_front_locked(lock)) written_.wait(lock);
    }
#if defined(__linux__)
    // Back to the normal class to exit promptly (a process without CAP_SYS_NICE may not: EPERM).
    if (options_.idle_writer && writer_tid_ != 0) set_thread_policy(writer_tid_, SCHED_OTHER);
#endif
  }
  if (writer_.joinable()) writer_.join();
  // The writer has stopped: the sink is this thread's now.
  const bool ok = sink_->close();
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  writer_tid_ = 0;
  if (!ok && !failed_) fail_locked(sink_->error());
  // Nothing more is recorded: the chunk buffers go back to the heap now, not when the owner of
  // this recorder is destroyed (a stopped session can outlive its recording by a long time).
  for (auto& chunk : queue_) stats_.dropped_events += chunk.second;  // none unless it failed
  queue_.clear();
  queued_bytes_ = 0;
  ChunkBytes(detail::page_mappings()).swap(current_);
  current_records_ = 0;
  std::vector<ChunkBytes>().swap(spare_);
  spare_bytes_ = 0;
  written_.notify_all();
}

void Recorder::fail_locked(std::string message) {
  failed_ = true;
  try {
    error_ = std::move(message);
  } catch (...) {
  }
  // Drop what is queued: it can no longer reach the file in order.
  for (auto& chunk : queue_) stats_.dropped_events += chunk.second;
  queue_.clear();
  queued_bytes_ = 0;
  stats_.dropped_events += current_records_;
  current_.clear();
  current_records_ = 0;
  written_.notify_all();
}

bool Recorder::failed() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

std::string Recorder::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

RecorderStats Recorder::stats() const {
  RecorderStats s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = stats_;
    s.buffer_bytes = held_locked();
    // The peak is noted where the buffers grow; the chunk being filled counts from its start.
    s.buffer_bytes_peak = std::max(s.buffer_bytes_peak, s.buffer_bytes);
  }
  const ChunkSinkStats written = sink_->stats();
  s.bytes_written = written.bytes_written;
  s.chunks_written = written.chunks_written;
  s.file_bytes = written.file_bytes;
  return s;
}

void Recorder::pause_writer_for_testing() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  writer_paused_ = true;
}

int Recorder::writer_policy() const noexcept {
#if defined(__linux__)
  int tid = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tid = writer_tid_;
  }
  return tid != 0 ? sched_getscheduler(tid) : -1;
#else
  return -1;
#endif
}

void Recorder::inject_write_failure() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  inject_failure_ = true;
}

}  // namespace ridgescope
