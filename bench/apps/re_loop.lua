-- bench/re_compare's loop, the same file on both servers: ngx.re.match with "jo" over a few
-- patterns, N times each inside one handler; returns one line a pattern, "name<TAB>matches
-- per CPU-second" (os.clock: the process's CPU time).
local CASES = {
    { "digits", "hello, 1234", "([0-9]+)", "jo" },
    { "request line", "GET /api/v1/users/12345/profile HTTP/1.1",
        "^(\\w+) (/api/v(\\d+)/users/(\\d+))", "jo" },
    { "named date", "2026-12-01T13:58:40Z",
        "(?<y>\\d{4})-(?<m>\\d{2})-(?<d>\\d{2})T(?<H>\\d{2}):(?<M>\\d{2})", "jo" },
    { "user agent, ijo", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like "
        .. "Gecko) Chrome/120.0.0.0 Safari/537.36", "(chrome|firefox)/([0-9.]+)", "ijo" },
    { "no match, 200 bytes", ("x"):rep(200), "[0-9]{3}-[0-9]{4}", "jo" },
}

return function(match, n)
    local out = {}
    for _, c in ipairs(CASES) do
        local name, subj, pat, opts = c[1], c[2], c[3], c[4]
        local expect = match(subj, pat, opts) ~= nil
        local t0 = os.clock()
        local hits = 0
        for _ = 1, n do
            if match(subj, pat, opts) then hits = hits + 1 end
        end
        local dt = os.clock() - t0
        assert(hits == (expect and n or 0), name .. ": a result changed")
        out[#out + 1] = string.format("%s\t%.0f", name, n / dt)
    end
    return table.concat(out, "\n") .. "\n"
end
