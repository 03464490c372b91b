-- wrk script for bench/wrk/run.sh: every request is one managed append of
-- one small record with a distinct key ("t<thread>-<n>").
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  counter = 0
  headers = { ["Content-Type"] = "application/x-ndjson" }
end

function request()
  counter = counter + 1
  local body = string.format('{"key":"t%d-%d","value":%d}\n', id, counter, counter)
  return wrk.format("POST", "/v1/shards/bench/append", headers, body)
end
