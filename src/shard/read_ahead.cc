#include "shard/read_ahead.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>

#include "part/part.h"
#include "util/executor.h"
#include "util/try.h"

namespace tidemark {

ReadAheadGrant& ReadAheadGrant::operator=(ReadAheadGrant&& other) noexcept {
  if (this != &other) {
    release();
    budget_ = std::move(other.budget_);
    bytes_ = std::exchange(other.bytes_, 0);
    fetching_ = std::exchange(other.fetching_, false);
    lease_ = std::move(other.lease_);
    other.lease_.reset();
  }
  return *this;
}

ReadAheadGrant::~ReadAheadGrant() {
  release();
}

void ReadAheadGrant::release() {
  lease_.reset();
  if (budget_) budget_->give_back(bytes_, fetching_);
  budget_.reset();
  bytes_ = 0;
  fetching_ = false;
}

void ReadAheadGrant::end_fetch() {
  if (!fetching_) return;
  fetching_ = false;
  budget_->fetch_ended();
}

std::optional<ReadAheadGrant> ReadAheadBudget::try_take(std::uint64_t bytes) {
  if (paused_.load(std::memory_order_relaxed)) return std::nullopt;
  {
    std::lock_guard lock(mu_);
    if (fetches_ >= kCursorFetches || bytes_ + bytes > kCursorBytes) return std::nullopt;
    bytes_ += bytes;
    ++fetches_;
    peak_ = std::max(peak_, bytes_);
  }
  ReadAheadGrant grant;
  grant.budget_ = shared_from_this();
  grant.bytes_ = bytes;
  grant.fetching_ = true;
  if (pool_) {
    // Room left for the blocks the merge loads (charged without waiting,
    // and may overdraw: a full pool must not be full of read-ahead).
    const std::int64_t blocks = merge_blocks_.load(std::memory_order_relaxed);
    const std::uint64_t headroom = blocks > 0 ? static_cast<std::uint64_t>(blocks) : 0;
    if (pool_->available() < bytes + headroom) return std::nullopt;  // the grant gives bytes back
    grant.lease_ = pool_->try_reserve(bytes);
    if (!grant.lease_) return std::nullopt;
  }
  return grant;
}

void ReadAheadBudget::give_back(std::uint64_t bytes, bool fetching) {
  std::lock_guard lock(mu_);
  bytes_ -= bytes;
  if (fetching) --fetches_;
}

void ReadAheadBudget::fetch_ended() {
  std::lock_guard lock(mu_);
  --fetches_;
}

std::uint64_t ReadAheadBudget::peak_bytes() const {
  std::lock_guard lock(mu_);
  return peak_;
}

std::uint64_t ReadAheadBudget::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

struct ReadAheadSource::Span {
  enum class State : std::uint8_t { kQueued, kRunning, kDone, kCancelled };
  Span(std::uint64_t offset, std::uint64_t length, ReadAheadGrant grant)
      : offset(offset), length(length), grant(std::move(grant)) {}

  const std::uint64_t offset;
  const std::uint64_t length;
  std::mutex mu;
  std::condition_variable done;
  State state = State::kQueued;               // GUARDED_BY(mu)
  std::optional<Result<std::string>> result;  // GUARDED_BY(mu), set once kDone
  // Released at cancel(), taken by the reader once kDone, else released
  // with the last reference.
  ReadAheadGrant grant;
};

namespace {
std::atomic<std::uint64_t> span_bytes{ReadAheadSource::kSpanBytes};
}  // namespace

void ReadAheadSource::set_span_bytes_for_testing(std::uint64_t bytes) {
  span_bytes.store(bytes == 0 ? kSpanBytes : bytes, std::memory_order_relaxed);
}

std::uint64_t ReadAheadSource::max_span_bytes() {
  return span_bytes.load(std::memory_order_relaxed);
}

void ReadAheadBudget::set_inputs(std::size_t inputs) {
  const std::uint64_t share = kCursorBytes / std::max<std::size_t>(inputs, 1);
  const std::uint64_t most = ReadAheadSource::max_span_bytes();
  span_bytes_ = std::min(most, std::max(kMinSpanBytes, share / 2));
  spans_ahead_ = static_cast<std::size_t>(
      std::clamp<std::uint64_t>(share / span_bytes_, 1, ReadAheadSource::kSpansPerPart));
}

ReadAheadSource::ReadAheadSource(std::shared_ptr<Blob> blob, std::string key, std::uint64_t size,
                                 std::shared_ptr<ReadAheadBudget> budget)
    : blob_(std::move(blob)),
      key_(std::make_shared<const std::string>(std::move(key))),
      size_(size),
      limit_(size - std::min(size, PartReader::kOpenFetchBytes)),
      budget_(std::move(budget)),
      span_bytes_(budget_->span_bytes()),
      spans_ahead_(budget_->spans_ahead()) {}

ReadAheadSource::~ReadAheadSource() {
  drop();
}

void ReadAheadSource::run(const std::shared_ptr<Span>& span, const std::shared_ptr<Blob>& blob,
                          const std::string& key) {
  {
    std::lock_guard lock(span->mu);
    if (span->state != Span::State::kQueued) return;  // cancelled, or taken over by its reader
    span->state = Span::State::kRunning;
  }
  Result<std::string> bytes = blob->get_range(key, span->offset, span->length);
  std::lock_guard lock(span->mu);
  span->result = std::move(bytes);
  span->state = Span::State::kDone;
  span->grant.end_fetch();
  span->done.notify_all();
}

void ReadAheadSource::wait(const std::shared_ptr<Span>& span) {
  std::unique_lock lock(span->mu);
  if (span->state == Span::State::kQueued) {
    // No thread has started it: fetch it here rather than wait for one.
    span->state = Span::State::kRunning;
    lock.unlock();
    Result<std::string> bytes = blob_->get_range(*key_, span->offset, span->length);
    lock.lock();
    span->result = std::move(bytes);
    span->state = Span::State::kDone;
    span->grant.end_fetch();
    return;
  }
  span->done.wait(lock, [&] { return span->state == Span::State::kDone; });
}

void ReadAheadSource::cancel(Span& span) {
  std::lock_guard lock(span.mu);
  if (span.state != Span::State::kQueued) return;  // its fetch ends on its own
  span.state = Span::State::kCancelled;
  // Its job, whenever it runs, does nothing: the bytes go back now.
  span.grant = ReadAheadGrant();
}

void ReadAheadSource::drop() {
  for (const std::shared_ptr<Span>& span : spans_) cancel(*span);
  spans_.clear();
  std::string().swap(current_);
  current_grant_ = ReadAheadGrant();
  // The next read issues spans again from where it ends.
  next_issue_ = 0;
}

bool ReadAheadSource::read_ahead_from(std::uint64_t offset) {
  if (!enabled_ || !budget_ || offset >= limit_) return true;
  next_issue_ = std::max(next_issue_, offset);
  WorkPool& pool = WorkPool::blob_io();
  while (spans_.size() < spans_ahead_ && next_issue_ < limit_) {
    const std::uint64_t length = std::min(span_bytes_, limit_ - next_issue_);
    std::optional<ReadAheadGrant> grant = budget_->try_take(length);
    if (!grant) return false;  // no room: read-ahead shrinks
    auto span = std::make_shared<Span>(next_issue_, length, std::move(*grant));
    // A full pool: the reader fetches what it needs itself.
    if (!pool.submit([span, blob = blob_, key = key_] { run(span, blob, *key); })) return true;
    spans_.push_back(std::move(span));
    next_issue_ += length;
  }
  return true;
}

Result<std::string> ReadAheadSource::fetch(std::uint64_t offset, std::uint64_t length) {
  const std::uint64_t end = offset + length;
  if (!current_.empty() && offset >= current_offset_ + current_.size()) {
    // The reader has moved past the span it read: its bytes go back now,
    // whether or not a span follows (else a part the budget left without
    // spans would keep them while it reads block by block).
    std::string().swap(current_);
    current_grant_ = ReadAheadGrant();
  }
  std::string out;
  std::uint64_t pos = offset;
  while (pos < end) {
    if (pos >= current_offset_ && pos < current_offset_ + current_.size()) {
      const std::uint64_t n = std::min(end, current_offset_ + current_.size()) - pos;
      out.append(current_, pos - current_offset_, n);
      pos += n;
      continue;
    }
    // Spans wholly before this read are never read (the reader moved on).
    while (!spans_.empty() && spans_.front()->offset + spans_.front()->length <= pos) {
      cancel(*spans_.front());
      spans_.pop_front();
    }
    if (!spans_.empty() && spans_.front()->offset <= pos) {
      std::shared_ptr<Span> span = std::move(spans_.front());
      spans_.pop_front();
      wait(span);
      // The span is ours alone now (its job has finished with it).
      Result<std::string> bytes = std::move(*span->result);
      if (bytes) {
        current_ = std::move(*bytes);
        current_offset_ = span->offset;
        current_grant_ = std::move(span->grant);
        if (pos < current_offset_ + current_.size()) continue;
        // The object ended inside the span: the read below says so.
      }
      // A span that failed is forgotten: the read below fetches what is
      // needed now itself, so an error comes from the blob at the block
      // that needs it, as without read-ahead (and a retry starts afresh).
    }
    TM_ASSIGN(std::string rest, blob_->get_range(*key_, pos, end - pos));
    if (out.empty()) {
      out = std::move(rest);
    } else {
      out.append(rest);
    }
    break;
  }
  if (offset < limit_) {
    last_end_ = end;
    read_ahead_from(end);
  }
  return out;
}

}  // namespace tidemark
