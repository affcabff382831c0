-- wrk script: each connection is one client that thinks between requests (a closed
-- population, as real users behave). The think time is exponential with the mean given
-- after `--` in milliseconds (500 if none): wrk ... -s tools/wrk-think.lua URL -- 500
-- At the end it prints one line the tests read: requests, counts by status (2xx too), errors.
think_ms = 500
counts = {}  -- per status; a global, so done() can read each thread's

function init(args)
  think_ms = tonumber(args[1]) or think_ms
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
end

function delay()
  return math.floor(-think_ms * math.log(1 - math.random()))
end

function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end

threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts")
    for status, n in pairs(c) do
      total[status] = (total[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(total) do
    table.insert(parts, string.format("%d:%d", status, n))
  end
  table.sort(parts)
  io.write(string.format("relakit: requests %d status %s p50_ms %.1f p99_ms %.1f "
                         .. "errors %d timeouts %d\n", summary.requests,
                         table.concat(parts, ","), latency:percentile(50) / 1000,
                         latency:percentile(99) / 1000,
                         summary.errors.connect + summary.errors.read + summary.errors.write,
                         summary.errors.timeout))
end
