// ForwardingBlob and ForwardingConsensus: decorators that forward every
// call to the backend they wrap (LevelDB's EnvWrapper habit). Every
// decorator that watches, slows down or fails calls derives from one and
// overrides only those calls, so a call it does not override reaches the
// backend as it was made: a blob's remove_many stays one batched delete.
// The fault injectors (faulty.h) and every test double are built on them.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidemark/location.h"

namespace tidemark {

// A Blob that forwards every call to `inner`; a decorator overrides the
// calls it watches, slows down or fails.
class ForwardingBlob : public Blob {
 public:
  explicit ForwardingBlob(std::shared_ptr<Blob> inner) : inner_(std::move(inner)) {}
  Result<std::optional<std::string>> get(std::string_view key) override { return inner_->get(key); }
  Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                std::uint64_t length) override {
    return inner_->get_range(key, offset, length);
  }
  Status set(std::string_view key, std::string_view bytes) override {
    return inner_->set(key, bytes);
  }
  Status remove(std::string_view key) override { return inner_->remove(key); }
  // Forwarded whole: the default would turn an S3 blob's batched delete
  // into single ones.
  Status remove_many(const std::vector<std::string>& keys) override {
    return inner_->remove_many(keys);
  }
  Status list(std::string_view prefix,
              const std::function<void(std::string_view, std::uint64_t)>& visit) override {
    return inner_->list(prefix, visit);
  }

 protected:
  Blob& inner() const { return *inner_; }

 private:
  std::shared_ptr<Blob> inner_;
};

// A Consensus that forwards every single call (and the change hints) to
// `inner`; a decorator
// overrides the calls it watches, slows down or fails. The batched calls (head_seqnos,
// compare_and_set_many, truncate_many) keep Consensus's defaults, which go
// through this object's single calls, so an override of a single call sees
// them too; a test that watches a batch whole overrides it and forwards it
// to inner().
class ForwardingConsensus : public Consensus {
 public:
  explicit ForwardingConsensus(std::shared_ptr<Consensus> inner) : inner_(std::move(inner)) {}
  Result<std::optional<VersionedData>> head(std::string_view key) override {
    return inner_->head(key);
  }
  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    return inner_->compare_and_set(key, expected, std::move(next));
  }
  Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                          std::size_t limit) override {
    return inner_->scan(key, from, limit);
  }
  Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override {
    return inner_->truncate(key, seqno);
  }
  // Hints are forwarded, so a decorated backend keeps its hint channel.
  std::optional<std::uint64_t> subscribe_change_hints(
      std::function<void(const ChangeHint&)> on_hint) override {
    return inner_->subscribe_change_hints(std::move(on_hint));
  }
  void unsubscribe_change_hints(std::uint64_t id) override { inner_->unsubscribe_change_hints(id); }

 protected:
  Consensus& inner() const { return *inner_; }

 private:
  std::shared_ptr<Consensus> inner_;
};

}  // namespace tidemark
