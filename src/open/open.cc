// open_blob and open_consensus: the URL -> backend mapping, over the
// backends this build has (TIDEMARK_WITH_S3, TIDEMARK_WITH_POSTGRES: a URL
// of a backend left out is InvalidUsage saying so). Paths in file:// and
// sqlite:// URLs are taken literally (no
// percent-decoding); s3:// and postgres:// URLs are parsed by their
// backends (s3_blob.h, postgres_consensus.h).
#include <memory>
#include <string>
#include <string_view>

#include "location/file_blob.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "location/sqlite_consensus.h"
#include "tidemark/location.h"
#include "util/try.h"
#if TIDEMARK_WITH_POSTGRES
#include "postgres/postgres_consensus.h"
#endif
#if TIDEMARK_WITH_S3
#include "s3/s3_blob.h"
#endif

namespace tidemark {

namespace {

constexpr std::string_view kFileScheme = "file://";
constexpr std::string_view kMemUrl = "mem://";
constexpr std::string_view kSqliteScheme = "sqlite://";

// The absolute path after `scheme`, e.g. "/abs/dir" from "file:///abs/dir".
Result<std::string> absolute_path_after(std::string_view url, std::string_view scheme,
                                        std::string_view example) {
  std::string_view path = url.substr(scheme.size());
  if (!path.starts_with('/')) {
    return invalid_usage("location URL \"" + std::string(url) +
                         "\" must name an absolute path, like " + std::string(example));
  }
  if (path.find_first_of("?#") != std::string_view::npos) {
    return invalid_usage("location URL \"" + std::string(url) +
                         "\": query strings and fragments are not supported");
  }
  return std::string(path);
}

bool has_scheme(std::string_view url, std::string_view scheme) {
  return url.starts_with(scheme) && url.substr(scheme.size()).starts_with("://");
}

}  // namespace

Result<std::shared_ptr<Blob>> open_blob(std::string_view url) {
  if (url == kMemUrl) return std::make_shared<MemBlob>();
  if (url.starts_with(kFileScheme)) {
    TM_ASSIGN(std::string path, absolute_path_after(url, kFileScheme, "file:///abs/dir"));
    TM_ASSIGN(std::unique_ptr<FileBlob> blob, FileBlob::open(std::move(path)));
    return std::shared_ptr<Blob>(std::move(blob));
  }
  if (has_scheme(url, "s3")) {
#if !TIDEMARK_WITH_S3
    return invalid_usage("location URL \"" + std::string(url) +
                         "\": this Tidemark was built without S3 (TIDEMARK_WITH_S3=OFF)");
#else
    TM_ASSIGN(std::unique_ptr<S3Blob> blob, S3Blob::open(url));
    return std::shared_ptr<Blob>(std::move(blob));
#endif
  }
  if (has_scheme(url, "sqlite") || has_scheme(url, "postgres") || has_scheme(url, "postgresql")) {
    return invalid_usage("location URL \"" + std::string(url) +
                         "\" names a consensus backend, not a blob backend");
  }
  return invalid_usage("unknown blob location URL \"" + std::string(url) +
                       "\" (expected file:///abs/dir, "
                       "s3://bucket/prefix?endpoint=http://host:port&region=R or mem://)");
}

Result<std::shared_ptr<Consensus>> open_consensus(std::string_view url) {
  if (url == kMemUrl) return std::make_shared<MemConsensus>();
  if (url.starts_with(kSqliteScheme)) {
    TM_ASSIGN(std::string path, absolute_path_after(url, kSqliteScheme, "sqlite:///abs/path.db"));
    TM_ASSIGN(std::unique_ptr<SqliteConsensus> consensus, SqliteConsensus::open(std::move(path)));
    return std::shared_ptr<Consensus>(std::move(consensus));
  }
  if (has_scheme(url, "postgres") || has_scheme(url, "postgresql")) {
#if !TIDEMARK_WITH_POSTGRES
    return invalid_usage("location URL \"" + std::string(url) +
                         "\": this Tidemark was built without PostgreSQL "
                         "(TIDEMARK_WITH_POSTGRES=OFF)");
#else
    TM_ASSIGN(std::unique_ptr<PostgresConsensus> consensus,
              PostgresConsensus::open(std::string(url)));
    return std::shared_ptr<Consensus>(std::move(consensus));
#endif
  }
  if (has_scheme(url, "file") || has_scheme(url, "s3")) {
    return invalid_usage("location URL \"" + std::string(url) +
                         "\" names a blob backend, not a consensus backend");
  }
  return invalid_usage("unknown consensus location URL \"" + std::string(url) +
                       "\" (expected sqlite:///abs/path.db, "
                       "postgres://user:password@host:port/db or mem://)");
}

}  // namespace tidemark
