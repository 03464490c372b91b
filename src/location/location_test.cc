// Runs the conformance suite (conformance.h) against every backend, and
// against the fault decorators with faults switched off, which must be
// indistinguishable from what they wrap. Backend-specific behaviour is
// tested beside each backend (file_blob_test.cc, sqlite_consensus_test.cc,
// postgres_consensus_test.cc, faulty_test.cc, open_test.cc).
//
// The PostgreSQL instances run against the server named by
// TIDEMARK_TEST_POSTGRES, each in a fresh schema, and skip when it is unset
// (postgres_test_schema.h). The S3 instance runs against the server named
// by TIDEMARK_TEST_S3, each under a fresh prefix, and skips when it is unset
// (s3_test_prefix.h).
#include <memory>
#include <string>

#include "location/faulty.h"
#include "location/file_blob.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "location/sqlite_consensus.h"
#include "testing/postgres_test_schema.h"
#include "testing/s3_test_prefix.h"
#include "testing/scratch_directory.h"
#include "tidemark/testing/conformance.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Owns a backend and the scratch directory it lives in. The backend is
// declared last so it is destroyed before the directory is removed.
template <typename Backend>
struct InScratchDirectory {
  ScratchDirectory directory;
  std::unique_ptr<Backend> backend;
};

Result<std::shared_ptr<Blob>> open_file_blob() {
  auto owner = std::make_shared<InScratchDirectory<FileBlob>>();
  TM_ASSIGN(owner->backend, FileBlob::open(owner->directory.path() + "/blob"));
  Blob* blob = owner->backend.get();
  return std::shared_ptr<Blob>(std::move(owner), blob);
}

Result<std::shared_ptr<Consensus>> open_sqlite_consensus() {
  auto owner = std::make_shared<InScratchDirectory<SqliteConsensus>>();
  TM_ASSIGN(owner->backend, SqliteConsensus::open(owner->directory.path() + "/consensus.db"));
  Consensus* consensus = owner->backend.get();
  return std::shared_ptr<Consensus>(std::move(owner), consensus);
}

INSTANTIATE_TEST_SUITE_P(Backends, BlobConformance,
                         ::testing::Values(BlobBackend{"Mem",
                                                       []() -> Result<std::shared_ptr<Blob>> {
                                                         return std::make_shared<MemBlob>();
                                                       }},
                                           BlobBackend{"File", open_file_blob},
                                           BlobBackend{"FaultyMem",
                                                       []() -> Result<std::shared_ptr<Blob>> {
                                                         return std::make_shared<FaultyBlob>(
                                                             std::make_shared<MemBlob>());
                                                       }}),
                         BackendName());

INSTANTIATE_TEST_SUITE_P(
    Backends, ConsensusConformance,
    ::testing::Values(ConsensusBackend{"Mem",
                                       []() -> Result<std::shared_ptr<Consensus>> {
                                         return std::make_shared<MemConsensus>();
                                       }},
                      ConsensusBackend{"Sqlite", open_sqlite_consensus},
                      ConsensusBackend{"FaultyMem",
                                       []() -> Result<std::shared_ptr<Consensus>> {
                                         return std::make_shared<FaultyConsensus>(
                                             std::make_shared<MemConsensus>());
                                       }}),
    BackendName());

INSTANTIATE_TEST_SUITE_P(Postgres, ConsensusConformance,
                         ::testing::Values(ConsensusBackend{"Postgres",
                                                            open_postgres_test_consensus}),
                         BackendName());

INSTANTIATE_TEST_SUITE_P(S3, BlobConformance,
                         ::testing::Values(BlobBackend{"S3", open_s3_test_blob}), BackendName());

}  // namespace
}  // namespace tidemark
