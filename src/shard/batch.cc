#include "tidemark/batch.h"

#include "tidemark/location.h"

namespace tidemark {

Batch::Batch(std::shared_ptr<Blob> blob, std::string shard, Description desc,
             std::vector<PartRef> parts, bool ordered)
    : blob_(std::move(blob)),
      shard_(std::move(shard)),
      desc_(desc),
      parts_(std::move(parts)),
      ordered_(ordered) {}

Batch::Batch(Batch&& other) noexcept
    : blob_(std::move(other.blob_)),
      shard_(std::move(other.shard_)),
      desc_(other.desc_),
      parts_(std::move(other.parts_)),
      ordered_(other.ordered_),
      state_(other.state_) {
  other.state_ = OwnershipState::kMovedFrom;
}

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    delete_parts_if_owned();
    blob_ = std::move(other.blob_);
    shard_ = std::move(other.shard_);
    desc_ = other.desc_;
    parts_ = std::move(other.parts_);
    ordered_ = other.ordered_;
    state_ = other.state_;
    other.state_ = OwnershipState::kMovedFrom;
  }
  return *this;
}

Batch::~Batch() {
  delete_parts_if_owned();
}

void Batch::delete_parts_if_owned() {
  if (state_ != OwnershipState::kOwned || !blob_) return;
  // Best effort: a part that cannot be deleted now is an orphan that
  // garbage collection finds later; it is never referenced by the shard.
  for (const PartRef& part : parts_) (void)blob_->remove(part.key);
  parts_.clear();
}

std::uint64_t Batch::count() const {
  std::uint64_t n = 0;
  for (const PartRef& part : parts_) n += part.count;
  return n;
}

Status Batch::truncate(Frontier new_lower) {
  if (new_lower < desc_.lower || desc_.upper < new_lower) {
    return invalid_usage("cannot truncate batch " + desc_.to_string() + " to lower " +
                         new_lower.to_string());
  }
  desc_.lower = new_lower;
  for (PartRef& part : parts_) {
    if (part.lower < new_lower) part.lower = new_lower;
    if (part.upper < part.lower) part.upper = part.lower;
  }
  return {};
}

}  // namespace tidemark
