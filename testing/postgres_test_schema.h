// PostgresTestSchema: a fresh, empty PostgreSQL schema for one test on the
// server named by TIDEMARK_TEST_POSTGRES, dropped with everything in it
// (CASCADE) when the object is destroyed. Test-only.
//
// A backend opened on url() sees only this schema: the URL sets libpq's
// `options` so the schema is the whole search_path, and names the
// connections after the schema (application_name) so a test can find them
// in pg_stat_activity.
//
// When TIDEMARK_TEST_POSTGRES is unset the PostgreSQL tests skip, saying
// so; when it is set but the server cannot be reached they fail.
//
// Thread-safety: a PostgresTestSchema is immutable after creation; destroy
// it once no connection uses the schema. A TestConnection is used by one
// thread at a time.
#pragma once

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "location/faulty.h"
#include "location/mem_consensus.h"
#include "postgres/postgres_consensus.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {

inline constexpr const char* kPostgresServerVariable = "TIDEMARK_TEST_POSTGRES";

// The server URL to test against, or nullopt when none is configured.
inline std::optional<std::string> postgres_test_server() {
  const char* url = std::getenv(kPostgresServerVariable);
  if (url == nullptr || *url == '\0') return std::nullopt;
  return std::string(url);
}

inline std::string no_postgres_server_message() {
  return std::string(kPostgresServerVariable) +
         " is unset: skipping a PostgreSQL test (set it to a server URL such as "
         "postgres://user:password@127.0.0.1:5432/db to run it)";
}

// A plain libpq connection for a test to prepare, observe and disturb the
// server with, outside the backend under test.
class TestConnection {
 public:
  static Result<std::unique_ptr<TestConnection>> open(const std::string& url) {
    auto connection = std::make_unique<TestConnection>(PrivateTag{}, PQconnectdb(url.c_str()));
    if (connection->connection_ == nullptr) return determinate("test connection: out of memory");
    if (PQstatus(connection->connection_.get()) != CONNECTION_OK) {
      return determinate(std::string("test connection: ") +
                         PQerrorMessage(connection->connection_.get()));
    }
    // Quiet: no "drop cascades to ..." notices on stderr.
    PQsetNoticeProcessor(
        connection->connection_.get(), [](void*, const char*) {}, nullptr);
    return connection;
  }

  // Runs `sql` (one or more statements); returns the first column of each
  // row of the last one, as text ("" for NULL).
  Result<std::vector<std::string>> query(const std::string& sql) {
    std::unique_ptr<PGresult, void (*)(PGresult*)> result(PQexec(connection_.get(), sql.c_str()),
                                                          &PQclear);
    ExecStatusType status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      return determinate(sql + ": " + PQerrorMessage(connection_.get()));
    }
    std::vector<std::string> column;
    for (int row = 0; row < PQntuples(result.get()); ++row) {
      column.emplace_back(PQnfields(result.get()) > 0 ? PQgetvalue(result.get(), row, 0) : "");
    }
    return column;
  }

  // The process id of this connection's server backend.
  int backend_pid() const { return PQbackendPID(connection_.get()); }

 private:
  // Lets open() use std::make_unique while keeping construction private.
  struct PrivateTag {};

 public:
  TestConnection(PrivateTag, PGconn* connection) : connection_(connection, &PQfinish) {}

 private:
  std::unique_ptr<PGconn, void (*)(PGconn*)> connection_;
};

class PostgresTestSchema {
 public:
  // Creates a schema named tm_test_<random> on `server`.
  static Result<std::unique_ptr<PostgresTestSchema>> create(std::string server) {
    TM_ASSIGN(auto admin, TestConnection::open(server));
    std::string name = "tm_test_" + random_id().substr(0, 16);
    TM_TRY(admin->query("CREATE SCHEMA " + name));
    return std::make_unique<PostgresTestSchema>(PrivateTag{}, std::move(server), std::move(name));
  }

  PostgresTestSchema(const PostgresTestSchema&) = delete;
  PostgresTestSchema& operator=(const PostgresTestSchema&) = delete;
  ~PostgresTestSchema() {
    auto admin = TestConnection::open(server_);
    auto dropped = admin ? (*admin)->query("DROP SCHEMA IF EXISTS " + name_ + " CASCADE")
                         : Result<std::vector<std::string>>(std::unexpected(admin.error()));
    if (!dropped) ADD_FAILURE() << "drop schema " << name_ << ": " << dropped.error().to_string();
  }

  const std::string& server() const { return server_; }
  const std::string& name() const { return name_; }

  // The server URL with this schema as the search_path.
  std::string url() const {
    return server_ + (server_.find('?') == std::string::npos ? "?" : "&") +
           "options=-csearch_path%3D" + name_ + "&application_name=" + name_;
  }

 private:
  // Lets create() use std::make_unique while keeping construction private.
  struct PrivateTag {};

 public:
  PostgresTestSchema(PrivateTag, std::string server, std::string name)
      : server_(std::move(server)), name_(std::move(name)) {}

 private:
  const std::string server_;
  const std::string name_;
};

// Records a skip of the running test (GTEST_SKIP returns from the function
// it is written in, so it lives in one of its own).
inline void skip_without_postgres_server() {
  GTEST_SKIP() << no_postgres_server_message();
}

// The conformance suite's factory: a PostgresConsensus in a fresh schema,
// dropped when the returned pointer is released. Without a server it skips
// the running test, and returns a backend whose every call fails: the
// suite's SetUp needs a non-null backend, and the skipped body never uses it.
inline Result<std::shared_ptr<Consensus>> open_postgres_test_consensus() {
  std::optional<std::string> server = postgres_test_server();
  if (!server) {
    skip_without_postgres_server();
    return std::make_shared<FaultyConsensus>(std::make_shared<MemConsensus>(),
                                             FaultConfig{.determinate_rate = 1});
  }
  // The backend is declared last so it is closed before the schema is dropped.
  struct InSchema {
    std::unique_ptr<PostgresTestSchema> schema;
    std::unique_ptr<PostgresConsensus> backend;
  };
  auto owner = std::make_shared<InSchema>();
  TM_ASSIGN(owner->schema, PostgresTestSchema::create(*server));
  TM_ASSIGN(owner->backend, PostgresConsensus::open(owner->schema->url()));
  Consensus* consensus = owner->backend.get();
  return std::shared_ptr<Consensus>(std::move(owner), consensus);
}

}  // namespace tidemark
