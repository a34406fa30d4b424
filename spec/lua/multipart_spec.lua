describe("moonserve.multipart", function()
    local multipart = require "moonserve.multipart"
    local concat = table.concat

    local B = "----WebKitFormBoundary7MA4YWxkTrZu0gW"

    -- Lines joined with CRLF, as a client writes them.
    local function crlf(lines)
        return concat(lines, "\r\n")
    end

    -- Two fields and a file whose data holds CRLFs and boundary-like strings that are not
    -- delimiters: "--B" inside a line, and "CRLF--B" followed by a byte no delimiter allows.
    local FILE_DATA = "line one\r\nsee --" .. B .. " in a line\r\n\r\n--" .. B .. "x\r\n-\r\n--\r"
    local BODY = crlf {
        "--" .. B,
        'Content-Disposition: form-data; name="title"',
        "",
        "Hello, world",
        "--" .. B,
        "Content-Disposition: form-data; name=note",
        "",
        "two\r\nlines",
        "--" .. B,
        'Content-Disposition: form-data; name="upload"; filename="a.txt"',
        "Content-Type: application/octet-stream",
        "",
        FILE_DATA,
        "--" .. B .. "--",
        "",
    }
    local EVENTS = {
        { type = "part", name = "title", content_type = "text/plain",
          headers = { ["content-disposition"] = 'form-data; name="title"' } },
        { type = "data", data = "Hello, world" },
        { type = "part_end" },
        { type = "part", name = "note", content_type = "text/plain",
          headers = { ["content-disposition"] = "form-data; name=note" } },
        { type = "data", data = "two\r\nlines" },
        { type = "part_end" },
        { type = "part", name = "upload", filename = "a.txt",
          content_type = "application/octet-stream",
          headers = { ["content-disposition"] = 'form-data; name="upload"; filename="a.txt"',
                      ["content-type"] = "application/octet-stream" } },
        { type = "data", data = FILE_DATA },
        { type = "part_end" },
        { type = "end" },
    }

    -- Takes every event the parser has; consecutive data events are merged, as how the data
    -- is split depends on how the input was. Returns the error, if any.
    local function drain(p, out)
        while true do
            local ev, err = p:next()
            if not ev then
                return err
            end
            local last = out[#out]
            if ev.type == "data" then
                assert.is_true(#ev.data > 0, "an empty data event")
                if last and last.type == "data" then
                    last.data = last.data .. ev.data
                else
                    out[#out + 1] = { type = "data", data = ev.data }
                end
            else
                out[#out + 1] = ev
            end
        end
    end

    -- Feeds the chunks in order, then finishes: returns the events, or nil, err.
    local function run(chunks, opts, boundary)
        local p = multipart.parser(boundary or B, opts)
        local out = {}
        for _, chunk in ipairs(chunks) do
            p:feed(chunk)
            local err = drain(p, out)
            if err then
                return nil, err
            end
        end
        p:finish()
        local err = drain(p, out)
        if err then
            return nil, err
        end
        return out
    end

    local mp = require "fixtures.multipart_body"
    local pieces_of = mp.pieces

    -- One part: its delimiter line, Content-Disposition, any more header lines, its data.
    local function part(name, headers, data)
        return mp.part(B, name, headers, data)
    end

    local function form(...)
        return mp.form(B, { ... })
    end

    -- A request as parts() sees it: the content type and the body in the given pieces.
    local function fake_req(content_type, pieces)
        local i = 0
        return {
            header = function(_, name)
                if name:lower() == "content-type" then
                    return content_type
                end
            end,
            read = function()
                i = i + 1
                local piece = pieces[i]
                if piece == false then
                    return nil, "ECONNRESET: connection reset by peer"
                end
                return piece
            end,
        }
    end

    local CT = "multipart/form-data; boundary=" .. B

    it("finds the boundary in a Content-Type value, quoted or not", function()
        assert.equal(B, multipart.boundary(CT))
        assert.equal("a b:c",
            multipart.boundary('Multipart/Form-Data; charset=utf-8; BOUNDARY="a b:c"'))
        assert.equal("x", multipart.boundary("multipart/form-data;boundary=x"))
        local longest = ("b"):rep(70)
        assert.equal(longest, multipart.boundary("multipart/form-data; boundary=" .. longest))
    end)

    it("refuses a Content-Type that is not multipart/form-data with a valid boundary", function()
        local cases = {
            { nil, "no content%-type" },
            { "application/x-www-form-urlencoded", "not multipart/form%-data" },
            { "multipart/mixed; boundary=x", "not multipart/form%-data" },
            { "multipart/form-data", "no boundary" },
            { "multipart/form-data; charset=utf-8", "no boundary" },
            { 'multipart/form-data; boundary=""', "invalid boundary" },
            { "multipart/form-data; boundary=" .. ("b"):rep(71), "invalid boundary" },
            { 'multipart/form-data; boundary="ends in space "', "invalid boundary" },
            { 'multipart/form-data; boundary="semi;colon"', "invalid boundary" },
            { 'multipart/form-data; boundary="unterminated', "unterminated" },
            { "multipart/form-data; boundary=a; boundary=b", "repeated parameter" },
            { "multipart/form-data boundary=x", "bad content%-type" },
        }
        for _, case in ipairs(cases) do
            local b, err = multipart.boundary(case[1])
            assert.is_nil(b, tostring(case[1]))
            assert.matches(case[2], err)
        end
    end)

    it("parses two fields and a file into part, data, part_end and end events", function()
        assert.same(EVENTS, run { BODY })
    end)

    it("parses the body identically when split in two at every byte position", function()
        for i = 1, #BODY - 1 do
            local events, err = run { BODY:sub(1, i), BODY:sub(i + 1) }
            assert.is_nil(err, "split at " .. i)
            assert.same(EVENTS, events, "split at " .. i)
        end
    end)

    it("parses the body identically when fed one byte at a time", function()
        assert.same(EVENTS, run(pieces_of(BODY, 1)))
    end)

    it("never holds back more than the boundary length plus 4 bytes of a part's data", function()
        local line = "0123456789abcdef\r\n--" .. B:sub(1, 20) .. "\r"
        local data = line:rep(30000):sub(1, 1024 * 1024)
        local head = crlf { "--" .. B, 'Content-Disposition: form-data; name="big"; filename="b"',
                            "", "" }
        local p = multipart.parser(B)
        p:feed(head)
        assert.equal("part", p:next().type)
        local got, fed, largest, pieces = {}, 0, 0, 0
        for i = 1, #data, 1024 do
            local piece = data:sub(i, i + 1023)
            p:feed(piece)
            fed = fed + #piece
            while true do
                local ev = p:next()
                if not ev then break end
                assert.equal("data", ev.type)
                got[#got + 1] = ev.data
                largest = math.max(largest, #ev.data)
            end
            -- Everything fed so far has come out, but for a possible start of a delimiter.
            assert.is_true(fed - #concat(got) <= #B + 4)
            pieces = #got
        end
        assert.is_true(pieces >= 1024) -- data came out while the part was still arriving
        assert.is_true(largest <= 1024 + #B + 4)
        p:feed("\r\n--" .. B .. "--")
        p:finish()
        local rest = {}
        drain(p, rest)
        assert.same({ type = "end" }, rest[#rest])
        if rest[1].type == "data" then
            got[#got + 1] = rest[1].data
        end
        assert.equal(data, concat(got))
    end)

    it("passes CRLFs and boundary-like strings that are not delimiters through as data", function()
        local tricky = {
            "\r\n", "\r\n\r\n", "\r", "\r\n-", "\r\n--", "--" .. B, "\r\n--" .. B .. "x",
            "\r\n--" .. B:sub(1, -2), "\r\n--" .. B:sub(1, -2) .. "\r\n--" .. B .. "_",
        }
        for i, data in ipairs(tricky) do
            local events = assert(run(pieces_of(form(part("f", nil, data)), 1)))
            assert.same({ type = "data", data = data }, events[2], "case " .. i)
        end
    end)

    it("ignores transport padding after a delimiter", function()
        local body = "--" .. B .. " \t\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--"
            .. B .. "\t\r\nContent-Disposition: form-data; name=b\r\n\r\n2\r\n--" .. B .. "--  \r\n"
        local events = assert(run { body })
        assert.equal("1", events[2].data)
        assert.equal("2", events[5].data)
    end)

    it("ignores the preamble and the epilogue", function()
        local preamble = "This is a preamble.\r\n--" .. B .. "x is not a delimiter\r\n"
        local epilogue = "This is the epilogue.\r\n--" .. B
            .. "\r\nContent-Disposition: junk\r\n\r\n"
        local body = preamble .. "\r\n" .. form(part("a", nil, "1")) .. epilogue
        local expect = {
            { type = "part", name = "a", content_type = "text/plain",
              headers = { ["content-disposition"] = "form-data; name=a" } },
            { type = "data", data = "1" },
            { type = "part_end" },
            { type = "end" },
        }
        assert.same(expect, run { body })
        assert.same(expect, run(pieces_of(body, 1)))
    end)

    it("returns an error for every malformed body, and keeps returning it", function()
        local D = "--" .. B .. "\r\n"
        local cases = {
            { "", "ended before the close delimiter" },
            { "no delimiter at all", "ended before the close delimiter" },
            { D .. "Content-Disposition: form-data; name=a\r\n\r\nunfinished",
              "ended before the close delimiter" },
            { D .. "Content-Disposition: form-data; name=a\r\n",
              "ended before the close delimiter" },
            { D .. "Content-Disposition: form-data; name=a\r\n\r\n\r\n--" .. B,
              "ended before the close delimiter" },
            { D .. "Content-Disposition: form-data; name=a\r\n\r\n\r\n--" .. B .. "-x",
              "bad close delimiter" },
            { "--" .. B .. " junk\r\nContent-Disposition: form-data; name=a\r\n\r\n",
              "bad delimiter line" },
            { D .. "Content-Disposition form-data; name=a\r\n\r\n", "bad part header line" },
            { D .. "Content Disposition: form-data; name=a\r\n\r\n", "bad part header line" },
            { D .. " Content-Disposition: form-data; name=a\r\n\r\n", "bad part header line" },
            { D .. "Content-Disposition: form-data; name=a\rb\r\n\r\n", "control character" },
            { D .. "Content-Type: text/plain\r\n\r\n", "without Content%-Disposition" },
            { D .. "\r\n", "without Content%-Disposition" },
            { D .. "Content-Disposition: attachment; name=a\r\n\r\n", "not form%-data" },
            { D .. "Content-Disposition: form-data\r\n\r\n", "without a name" },
            { D .. "Content-Disposition: form-data; filename=a\r\n\r\n", "without a name" },
            { D .. 'Content-Disposition: form-data; name="a\r\n\r\n',
              "unterminated quoted string" },
            { D .. "Content-Disposition: form-data; name=a; name=b\r\n\r\n",
              "repeated parameter name" },
            { D .. "Content-Disposition: form-data; name=a\r\nContent-Disposition: form-data; "
              .. "name=b\r\n\r\n", "bad Content%-Disposition" },
            { D .. "Content-Disposition: form-data; name=a b\r\n\r\n", "bad parameter list" },
            { D .. "Content-Disposition: form-data; name=\r\n\r\n", "bad parameter value" },
            { D .. "Content-Disposition: form-data; =a\r\n\r\n", "bad parameter" },
            { D .. "Content-Disposition: form-data; name=a; filename*=no-quotes\r\n\r\n",
              "bad filename%*" },
        }
        for _, case in ipairs(cases) do
            for _, size in ipairs { #case[1] + 1, 1 } do -- whole, then a byte at a time
                local p = multipart.parser(B)
                local err
                for _, piece in ipairs(pieces_of(case[1], size)) do
                    p:feed(piece)
                    repeat
                        local ev, e = p:next()
                        err = e
                    until not ev or err
                    if err then break end
                end
                if not err then
                    p:finish()
                    repeat
                        local ev, e = p:next()
                        err = e
                    until not ev
                end
                assert.is_string(err, case[1])
                assert.matches(case[2], err)
                local ev, again = p:next()
                assert.is_nil(ev)
                assert.equal(err, again)
            end
        end
    end)

    it("reads quoted names with escaped quotes and keeps other backslashes", function()
        local events = assert(run { form(crlf {
            "--" .. B,
            [[Content-Disposition: form-data; name="a \"quoted\" \\ name"; ]]
                .. [[filename="C:\dir\f.txt"]],
            "", "x",
        }) })
        assert.equal([[a "quoted" \ name]], events[1].name)
        assert.equal([[C:\dir\f.txt]], events[1].filename)
    end)

    it("prefers an RFC 5987 filename* over filename", function()
        local function filename(params)
            local events = assert(run { form(crlf {
                "--" .. B, "Content-Disposition: form-data; name=f; " .. params, "", "x" }) })
            return events[1].filename
        end
        assert.equal("€ rates.txt",
            filename([[filename="EUR rates.txt"; filename*=UTF-8''%E2%82%AC%20rates.txt]]))
        assert.equal("€ rates.txt",
            filename([[filename*=utf-8''%e2%82%ac%20rates.txt; filename="EUR rates.txt"]]))
        assert.equal("£ rates.txt", filename([[filename*=iso-8859-1'en'%A3%20rates.txt]]))
        assert.equal("fallback.txt", filename([[filename*=KOI8-R''%F0; filename=fallback.txt]]))
        assert.equal("", filename([[filename=""]]))
    end)

    it("refuses a part header section over max_header_bytes", function()
        local big = "X-Big: " .. ("v"):rep(8192)
        local _, err = run { form(part("a", big, "1")) }
        assert.matches("over 8192 bytes", err)
        _, err = run(pieces_of(form(part("a", big, "1")), 100))
        assert.matches("over 8192 bytes", err)
        -- The section counts from after the boundary to the blank line that ends it.
        local exact = #("\r\nContent-Disposition: form-data; name=a\r\nX: 12\r\n\r\n")
        assert.truthy(run({ form(part("a", "X: 12", "1")) }, { max_header_bytes = exact }))
        _, err = run({ form(part("a", "X: 123", "1")) }, { max_header_bytes = exact })
        assert.matches("over " .. exact .. " bytes", err)
    end)

    it("refuses more parts than max_parts", function()
        assert.truthy(run({ form(part("a"), part("b")) }, { max_parts = 2 }))
        local _, err = run({ form(part("a"), part("b"), part("c")) }, { max_parts = 2 })
        assert.matches("more than 2 parts", err)
        local many = {}
        for i = 1, 1001 do
            many[i] = part("p" .. i)
        end
        assert.truthy(run { form(unpack(many, 1, 1000)) })
        _, err = run { form(unpack(many)) }
        assert.matches("more than 1000 parts", err)
    end)

    it("parses empty parts, empty values and a form with no parts", function()
        local body = form(part("empty"), part('""', nil, ""), part("last", "X-A: 1"))
        local events = assert(run { body })
        local types = {}
        for i, ev in ipairs(events) do
            types[i] = ev.type
        end
        assert.same({ "part", "part_end", "part", "part_end", "part", "part_end", "end" }, types)
        assert.equal("empty", events[1].name)
        assert.equal("", events[3].name)
        assert.same({ ["content-disposition"] = "form-data; name=last", ["x-a"] = "1" },
            events[5].headers)
        assert.same({ { type = "end" } }, run { "--" .. B .. "--" })
    end)

    it("raises on misuse of the parser", function()
        assert.has_error(function() multipart.parser("bad;boundary") end)
        assert.has_error(function() multipart.parser(("b"):rep(71)) end)
        local p = multipart.parser(B)
        assert.has_error(function() p:feed(42) end)
        p:finish()
        assert.has_error(function() p:feed("more") end)
    end)

    it("keeps the data path on trace", function()
        local p = multipart.parser(B)
        p:feed(crlf { "--" .. B, "Content-Disposition: form-data; name=f", "", "" })
        assert.equal("part", p:next().type)
        local piece = ("data"):rep(256)
        local file = os.tmpname()
        local v = require "jit.v"
        jit.flush() -- earlier specs may have compiled these paths already
        v.on(file)
        local events = 0
        for _ = 1, 500 do -- one event per piece: an inner loop would make this a side trace
            p:feed(piece)
            if p:next() then
                events = events + 1
            end
        end
        v.off()
        assert.equal(500, events)
        local f = assert(io.open(file))
        local log = f:read("*a")
        f:close()
        os.remove(file)
        -- Which traces form (the loop above with the parser inlined, or the parser's own
        -- traces) depends on what ran before; what must hold is that the data path compiles
        -- and nothing aborts.
        assert.matches("TRACE%s+%d+ multipart", log)
        assert.not_matches("NYI", log)
        assert.not_matches("abort", log)
    end)

    describe("parts(req)", function()
        it("yields the parts, skipping those not read, and reads a part's body", function()
            for _, size in ipairs { 1, 7, #BODY } do
                local req = fake_req(CT, pieces_of(BODY, size))
                local seen = {}
                for p in assert(multipart.parts(req)) do
                    seen[#seen + 1] = p.name
                    if p.name == "title" then
                        assert.equal("text/plain", p.content_type)
                        assert.equal("Hello, world", p:body())
                        assert.equal("Hello, world", p:body()) -- read once, kept
                        assert.is_nil(p:read())
                    elseif p.name == "upload" then
                        assert.equal("a.txt", p.filename)
                        assert.equal("application/octet-stream", p.headers["content-type"])
                        local first = p:read() -- then leave the rest unread
                        assert.equal(FILE_DATA:sub(1, #first), first)
                    end
                end
                assert.same({ "title", "note", "upload" }, seen)
            end
        end)

        it("returns nil and an error for a request that is not multipart/form-data", function()
            local parts, err = multipart.parts(fake_req("application/json", { "{}" }))
            assert.is_nil(parts)
            assert.matches("not multipart/form%-data", err)
        end)

        it("raises a clear error for a malformed body", function()
            local body = crlf { "--" .. B, "Content-Type: text/plain", "", "x", "--" .. B .. "--" }
            local ok, err = pcall(function()
                for _ in assert(multipart.parts(fake_req(CT, { body }))) do end
            end)
            assert.is_false(ok)
            assert.equal("bad multipart body: part without Content-Disposition", err)
            ok, err = pcall(function()
                for p in assert(multipart.parts(fake_req(CT, { BODY:sub(1, 60) }))) do p:body() end
            end)
            assert.is_false(ok)
            assert.equal("bad multipart body: body ended before the close delimiter", err)
        end)

        it("ends the loop without raising when reading the request body fails", function()
            -- broken inside the head of the first part: the iterator ends, with why
            local it = assert(multipart.parts(fake_req(CT, { BODY:sub(1, 20), false })))
            local first, err = it()
            assert.is_nil(first)
            assert.matches("^reading the multipart body failed: ECONNRESET", err)
            assert.is_nil(it()) -- the loop has ended
            -- broken inside a part's body: part:body() returns nil and why, the loop ends
            local errs, n = {}, 0
            local cut = BODY:find("\r\n\r\n", 1, true) + 5
            for p in assert(multipart.parts(fake_req(CT, { BODY:sub(1, cut), false }))) do
                local body, berr = p:body()
                assert.is_nil(body)
                n = n + 1
                errs[n] = berr
            end
            assert.equal(1, n)
            assert.matches("^reading the multipart body failed: ECONNRESET", errs[1])
        end)

        it("returns nil and an error for a request the core refused already", function()
            local req = fake_req(CT, { BODY })
            req.refused = function() return 413 end
            local it, err = multipart.parts(req)
            assert.is_nil(it)
            assert.equal("the core answered 413 in the handler's place", err)
        end)

        it("streams a part into a file with part:save()", function()
            local path = os.tmpname()
            local sizes = {}
            for p in assert(multipart.parts(fake_req(CT, pieces_of(BODY, 5)))) do
                if p.filename then
                    sizes[#sizes + 1] = assert(p:save(path))
                end
            end
            local f = assert(io.open(path, "rb"))
            local saved = f:read("*a")
            f:close()
            os.remove(path)
            assert.same({ #FILE_DATA }, sizes)
            assert.equal(FILE_DATA, saved)
            local p = assert(multipart.parts(fake_req(CT, { BODY })))()
            local n, err = p:save("/nonexistent-dir/x")
            assert.is_nil(n)
            assert.is_string(err)
        end)

        it("works when req:read() yields, as it does inside a handler", function()
            local req = fake_req(CT, pieces_of(BODY, 3))
            local read = req.read
            req.read = function(self)
                coroutine.yield("parked")
                return read(self)
            end
            local co = coroutine.wrap(function()
                local bodies = {}
                for p in assert(multipart.parts(req)) do
                    local path = os.tmpname()
                    assert(p:save(path)) -- pcall inside, across the yields
                    local f = assert(io.open(path, "rb"))
                    bodies[p.name] = f:read("*a")
                    f:close()
                    os.remove(path)
                end
                return bodies
            end)
            local result = co()
            while result == "parked" do
                result = co()
            end
            assert.same({ title = "Hello, world", note = "two\r\nlines", upload = FILE_DATA },
                result)
        end)
    end)
end)
