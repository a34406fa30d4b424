describe("moonserve.session", function()
    local session = require "moonserve.session"
    local crypto = require "moonserve.crypto"

    local SECRET = "an example secret of at least 32 bytes, never this one"
    local OLD_SECRET = "the secret this app used before, also 32 bytes or more"

    -- The Cookie field a browser sends back for a Set-Cookie value.
    local function cookie_of(set_cookie)
        return (set_cookie:match("^[^;]*"))
    end

    local function value_of(set_cookie)
        return (set_cookie:match("^[^=]*=([^;]*)"))
    end

    -- A clock the spec moves by hand.
    local function clock(t)
        local c = { t = t or 1700000000 }
        c.now = function() return c.t end
        return c
    end

    local function saved(m, data)
        local s = m:load(nil)
        for k, v in pairs(data) do
            s:set(k, v)
        end
        return m:save(s), s
    end

    it("loads without the server core", function()
        assert.is_nil(package.loaded["moonserve.core"])
        assert.is_nil(package.loaded["moonserve.host.core.base"])
    end)

    for _, encrypt in ipairs({ true, false }) do
        describe(encrypt and "encrypted" or "signed only", function()
            local m = session.new { secret = SECRET, encrypt = encrypt }

            it("loads back what was saved", function()
                local set_cookie, s = saved(m, { user = "ada", roles = { "admin", "dev" },
                    n = 3 })
                local back = m:load(cookie_of(set_cookie))
                assert.is_false(back.is_new)
                assert.equal(s.id, back.id)
                assert.equal("ada", back:get("user"))
                assert.same({ "admin", "dev" }, back:get("roles"))
                assert.equal(3, back:get("n"))
            end)

            it("loads from a request's Cookie field, among other cookies", function()
                local set_cookie = saved(m, { user = "ada" })
                local req = { header = function(_, name)
                    assert.equal("cookie", name)
                    return "theme=dark; " .. cookie_of(set_cookie) .. "; lang=en"
                end }
                assert.equal("ada", m:load(req):get("user"))
            end)

            local cases = {
                { "a flipped character in the data", function(v)
                    local i = 5
                    return v:sub(1, i - 1) .. (v:sub(i, i) == "A" and "B" or "A") .. v:sub(i + 1)
                end },
                { "a flipped character in the signature", function(v)
                    return v:sub(1, -3) .. (v:sub(-2, -2) == "A" and "B" or "A") .. v:sub(-1)
                end },
                { "a value cut short by one byte", function(v) return v:sub(1, -2) end },
                { "a value cut in half", function(v) return v:sub(1, math.floor(#v / 2)) end },
                { "the signature missing", function(v) return v:match("^[^.]*") end },
                { "the signature alone", function(v) return v:match("%.(.*)$") end },
                { "an empty signature", function(v) return v:match("^[^.]*%.") end },
                { "a signature from another value", function(v)
                    local other = value_of(saved(m, { user = "eve" }))
                    return v:match("^[^.]*") .. other:match("%..*$")
                end },
                { "data from another value", function(v)
                    local other = value_of(saved(m, { user = "eve" }))
                    return other:match("^[^.]*") .. v:match("%..*$")
                end },
                { "an extra dot", function(v) return v .. ".x" end },
                { "an empty value", function() return "" end },
                { "garbage", function() return "%%%not-base64%%%.%%%" end },
            }
            for _, case in ipairs(cases) do
                it("loads a fresh empty session from a cookie with " .. case[1], function()
                    local set_cookie, s = saved(m, { user = "ada" })
                    local bad = case[2](value_of(set_cookie))
                    local back, why = m:load("session=" .. bad)
                    assert.is_true(back.is_new)
                    assert.is_nil(back:get("user"))
                    assert.not_equal(s.id, back.id)
                    assert.is_string(why)
                end)
            end

            it("refuses a cookie with any one character changed", function()
                local v = value_of((saved(m, { user = "ada" })))
                for i = 1, #v do
                    local c = v:sub(i, i)
                    local bad = v:sub(1, i - 1) .. (c == "x" and "y" or "x") .. v:sub(i + 1)
                    assert.is_true(m:load("session=" .. bad).is_new, "changed at " .. i)
                end
            end)

            it("refuses a cookie signed with another secret", function()
                local other = session.new { secret = string.rep("z", 32), encrypt = encrypt }
                local back, why = m:load(cookie_of((saved(other, { user = "eve" }))))
                assert.is_true(back.is_new)
                assert.equal("bad signature", why)
            end)

            it("refuses a value moved into a cookie of another name", function()
                local other = session.new { secret = SECRET, encrypt = encrypt, name = "other" }
                local v = value_of((saved(other, { user = "eve" })))
                assert.is_true(m:load("session=" .. v).is_new)
            end)
        end)
    end

    it("keeps the data unreadable in an encrypted cookie", function()
        local m = session.new { secret = SECRET }
        local v = value_of((saved(m, { user = "ada-lovelace" })))
        local raw = crypto.base64url_decode(v:match("^[^.]*"))
        assert.not_matches("ada-lovelace", raw, 1, true)
    end)

    it("keeps the data readable but signed when encrypt is false", function()
        local m = session.new { secret = SECRET, encrypt = false }
        local v = value_of((saved(m, { user = "ada-lovelace" })))
        local raw = crypto.base64url_decode(v:match("^[^.]*"))
        assert.matches("ada-lovelace", raw, 1, true)
    end)

    it("refuses a signed-only cookie in a manager that encrypts, and the other way", function()
        local plain = session.new { secret = SECRET, encrypt = false }
        local sealed = session.new { secret = SECRET, encrypt = true }
        assert.is_true(sealed:load(cookie_of((saved(plain, { a = 1 })))).is_new)
        assert.is_true(plain:load(cookie_of((saved(sealed, { a = 1 })))).is_new)
    end)

    it("gives a fresh session without a cookie, and a new id each time", function()
        local m = session.new { secret = SECRET }
        local a, why = m:load(nil)
        local b = m:load("other=1")
        assert.is_true(a.is_new)
        assert.is_nil(why)
        assert.not_equal(a.id, b.id)
        assert.equal(22, #a.id)
        -- (made when first read, then kept: the id a token was bound to is the one saved)
        local id = a.id
        assert.equal(id, a.id)
        a:set("k", 1)
        assert.equal(id, m:load(cookie_of((m:save(a)))).id)
    end)

    it("never raises on any cookie value", function()
        local m = session.new { secret = SECRET }
        for _ = 1, 200 do
            local junk = crypto.base64url_encode(crypto.random(math.random(0, 80)))
            assert.is_true(m:load("session=" .. junk).is_new)
            assert.is_true(m:load("session=" .. junk .. "." .. junk).is_new)
        end
    end)

    describe("save", function()
        it("returns nil when nothing changed", function()
            local m = session.new { secret = SECRET }
            assert.is_nil(m:save(m:load(nil)))
            local back = m:load(cookie_of((saved(m, { a = 1 }))))
            back:get("a")
            assert.is_nil(m:save(back))
        end)

        it("returns nil when saved twice without a change in between", function()
            local m = session.new { secret = SECRET }
            local set_cookie, s = saved(m, { a = 1 })
            assert.is_string(set_cookie)
            assert.is_nil(m:save(s))
        end)

        it("sets the cookie's attributes, by default Path=/, HttpOnly and SameSite=Lax", function()
            local m = session.new { secret = SECRET }
            local set_cookie = saved(m, { a = 1 })
            assert.matches("^session=[%w%-_]+%.[%w%-_]+; Path=/; Max%-Age=86400; HttpOnly; "
                .. "SameSite=Lax$", set_cookie)
        end)

        it("uses the name, max_age and cookie attributes given", function()
            local m = session.new { secret = SECRET, name = "__Host-sid", max_age = 600,
                cookie = { secure = true, same_site = "Strict", http_only = false } }
            local set_cookie = saved(m, { a = 1 })
            assert.matches("^__Host%-sid=[^;]+; Path=/; Max%-Age=600; Secure; SameSite=Strict$",
                set_cookie)
        end)

        it("makes the cookie Secure for a request over https, unless the options say", function()
            local m = session.new { secret = SECRET }
            local function save_for(mgr, req)
                local s = mgr:load(nil)
                s:set("a", 1)
                return mgr:save(s, req)
            end
            assert.matches("; Secure;", save_for(m, { scheme = "https" }), 1, true)
            assert.not_matches("Secure", save_for(m, { scheme = "http" }))
            assert.not_matches("Secure", save_for(m, nil))
            local back = m:load(cookie_of(save_for(m, { scheme = "https" })))
            back:destroy()
            assert.matches("; Secure;", m:save(back, { scheme = "https" }), 1, true)
            local plain = session.new { secret = SECRET, cookie = { secure = false } }
            assert.not_matches("Secure", save_for(plain, { scheme = "https" }))
        end)

        it("clears the cookie of a destroyed session", function()
            local m = session.new { secret = SECRET }
            local back = m:load(cookie_of((saved(m, { user = "ada" }))))
            local id = back.id
            back:destroy()
            assert.is_nil(back:get("user"))
            assert.not_equal(id, back.id)
            assert.equal("session=; Path=/; Max-Age=0; Expires=Thu, 01 Jan 1970 00:00:00 GMT; "
                .. "HttpOnly; SameSite=Lax", m:save(back))
        end)

        it("raises when the data is too big for a cookie, and keeps it unsaved", function()
            local m = session.new { secret = SECRET }
            local s = m:load(nil)
            s:set("blob", string.rep("x", 4000))
            local ok, err = pcall(m.save, m, s)
            assert.is_false(ok)
            assert.matches("session too big for a cookie %(%d+ bytes, at most 4096%)", err)
            s:set("blob", "small")
            assert.is_string(m:save(s))
        end)

        it("fits data that is just small enough for a cookie", function()
            local m = session.new { secret = SECRET }
            local s = m:load(nil)
            s:set("blob", string.rep("x", 2800))
            assert.is_true(#m:save(s) <= 4096)
        end)

        it("raises when the data cannot be JSON", function()
            local m = session.new { secret = SECRET }
            local s = m:load(nil)
            s:set("f", print)
            assert.has_error(function() m:save(s) end)
        end)

        it("raises on a table that does not come from load", function()
            local m = session.new { secret = SECRET }
            assert.has_error(function() m:save({ id = "x" }) end)
        end)
    end)

    describe("keep", function()
        it("saves a new empty session, so its id comes back on the next request", function()
            local m = session.new { secret = SECRET }
            local s = m:load(nil)
            assert.is_nil(m:save(s))          -- without keep: nothing to keep, no cookie
            s = m:load(nil)
            s:keep()
            local set_cookie = m:save(s)
            assert.is_string(set_cookie)
            assert.matches("Max%-Age=86400", set_cookie)
            local back = m:load(cookie_of(set_cookie))
            assert.is_false(back.is_new)
            assert.equal(s.id, back.id)
        end)

        it("does not save again a session that came with its cookie", function()
            local m = session.new { secret = SECRET }
            local back = m:load(cookie_of((saved(m, { user = "ada" }))))
            back:keep()
            assert.is_nil(m:save(back))
        end)

        it("gives way to destroy, unless called after it", function()
            local m = session.new { secret = SECRET }
            local s = m:load(nil)
            s:keep()
            s:destroy()
            assert.matches("Max%-Age=0", m:save(s))
            s = m:load(nil)
            s:destroy()
            s:keep()
            assert.matches("Max%-Age=86400", m:save(s))
        end)
    end)

    describe("regenerate", function()
        it("changes the id and keeps the data", function()
            local m = session.new { secret = SECRET }
            local back = m:load(cookie_of((saved(m, { user = "ada" }))))
            local id = back.id
            back:regenerate()
            assert.not_equal(id, back.id)
            local again = m:load(cookie_of(m:save(back)))
            assert.equal(back.id, again.id)
            assert.equal("ada", again:get("user"))
        end)
    end)

    it("raises on a session key that is not a string", function()
        local s = session.new({ secret = SECRET }):load(nil)
        assert.has_error(function() s:set(1, "x") end)
    end)

    describe("key rotation", function()
        local old = session.new { secret = OLD_SECRET }
        local rotated = session.new { secrets = { SECRET, OLD_SECRET } }
        local new_only = session.new { secret = SECRET }

        it("still accepts a cookie signed with an older secret", function()
            local back = rotated:load(cookie_of((saved(old, { user = "ada" }))))
            assert.is_false(back.is_new)
            assert.equal("ada", back:get("user"))
        end)

        it("signs new cookies with the first secret", function()
            local set_cookie = saved(rotated, { user = "ada" })
            assert.equal("ada", new_only:load(cookie_of(set_cookie)):get("user"))
            assert.is_true(old:load(cookie_of(set_cookie)).is_new)
        end)

        it("re-signs an unchanged session that came with an older secret", function()
            local back = rotated:load(cookie_of((saved(old, { user = "ada" }))))
            local set_cookie = rotated:save(back)
            assert.is_string(set_cookie)
            assert.equal("ada", new_only:load(cookie_of(set_cookie)):get("user"))
        end)

        it("refuses the older secret once it is dropped from the list", function()
            local back, why = new_only:load(cookie_of((saved(old, { user = "ada" }))))
            assert.is_true(back.is_new)
            assert.equal("bad signature", why)
        end)
    end)

    describe("expiry", function()
        it("accepts a cookie until max_age has passed, then refuses it", function()
            local c = clock()
            local m = session.new { secret = SECRET, max_age = 60, now = c.now }
            local cookie = cookie_of((saved(m, { user = "ada" })))
            c.t = c.t + 59
            assert.equal("ada", m:load(cookie):get("user"))
            c.t = c.t + 1
            local back, why = m:load(cookie)
            assert.is_true(back.is_new)
            assert.equal("expired", why)
        end)

        it("counts max_age from the last save", function()
            local c = clock()
            local m = session.new { secret = SECRET, max_age = 60, now = c.now }
            local cookie = cookie_of((saved(m, { n = 1 })))
            c.t = c.t + 50
            local s = m:load(cookie)
            s:set("n", 2)
            cookie = cookie_of(m:save(s))
            c.t = c.t + 50
            assert.equal(2, m:load(cookie):get("n"))
        end)
    end)

    describe("with a store", function()
        local function setup(opts)
            local c = clock()
            local store = session.memory_store { now = c.now }
            local o = { secret = SECRET, store = store, now = c.now, max_age = 60 }
            for k, v in pairs(opts or {}) do
                o[k] = v
            end
            return session.new(o), store, c
        end

        it("keeps the data on the server and only a signed id in the cookie", function()
            local m, store = setup()
            local set_cookie, s = saved(m, { user = "ada-lovelace" })
            local v = value_of(set_cookie)
            assert.equal(s.id, v:match("^[^.]*"))
            assert.not_matches("ada", v, 1, true)
            assert.matches("ada-lovelace", store.get(s.id), 1, true)
            assert.equal("ada-lovelace", m:load(cookie_of(set_cookie)):get("user"))
        end)

        it("keeps a cookie small whatever the data's size", function()
            local m = setup()
            local set_cookie = saved(m, { blob = string.rep("x", 100000) })
            assert.is_true(#set_cookie < 200)
        end)

        it("refuses an id it has no record of, even a signed one", function()
            local m, store = setup()
            local set_cookie, s = saved(m, { user = "ada" })
            store.delete(s.id)
            local back, why = m:load(cookie_of(set_cookie))
            assert.is_true(back.is_new)
            assert.not_equal(s.id, back.id)
            assert.equal("unknown session", why)
        end)

        it("refuses an id that is not signed", function()
            local m = setup()
            local _, s = saved(m, { user = "ada" })
            assert.is_true(m:load("session=" .. s.id).is_new)
            assert.is_true(m:load("session=" .. s.id .. ".forged").is_new)
        end)

        it("forgets a session once max_age has passed", function()
            local m, _, c = setup()
            local cookie = cookie_of((saved(m, { user = "ada" })))
            c.t = c.t + 60
            assert.is_true(m:load(cookie).is_new)
        end)

        it("checks the expiry itself when a store keeps records longer", function()
            local c = clock()
            local records = {}
            local forgetful = {   -- ignores ttl
                get = function(id) return records[id] end,
                set = function(id, data) records[id] = data; return true end,
                delete = function(id) records[id] = nil end,
            }
            local m = session.new { secret = SECRET, store = forgetful, now = c.now,
                max_age = 60 }
            local cookie = cookie_of((saved(m, { user = "ada" })))
            c.t = c.t + 60
            local back, why = m:load(cookie)
            assert.is_true(back.is_new)
            assert.equal("expired", why)
        end)

        it("moves the record to the new id on regenerate", function()
            local m, store = setup()
            local back = m:load(cookie_of((saved(m, { user = "ada" }))))
            local old_id = back.id
            back:regenerate()
            local set_cookie = m:save(back)
            assert.is_nil(store.get(old_id))
            assert.equal("ada", m:load(cookie_of(set_cookie)):get("user"))
        end)

        it("deletes the record of a destroyed session", function()
            local m, store = setup()
            local back = m:load(cookie_of((saved(m, { user = "ada" }))))
            local old_id = back.id
            back:destroy()
            assert.matches("Max%-Age=0", m:save(back))
            assert.is_nil(store.get(old_id))
        end)

        it("returns nil and the store's error when the store fails, and can save later",
            function()
                local down = true
                local records = {}
                local flaky = {
                    get = function(id) return records[id] end,
                    set = function(id, data)
                        if down then return nil, "store is down" end
                        records[id] = data
                        return true
                    end,
                    delete = function(id) records[id] = nil end,
                }
                local m = session.new { secret = SECRET, store = flaky }
                local s = m:load(nil)
                s:set("a", 1)
                local v, err = m:save(s)
                assert.is_nil(v)
                assert.equal("store is down", err)
                down = false
                assert.equal(1, m:load(cookie_of(m:save(s))):get("a"))
            end)

        it("keeps the old record when saving a regenerated session fails", function()
            local m, store = setup()
            local back = m:load(cookie_of((saved(m, { user = "ada" }))))
            local old_id = back.id
            back:regenerate()
            back:set("blob", false)
            local set = store.set
            store.set = function() return nil, "store is down" end
            assert.is_nil(m:save(back))
            store.set = set
            assert.is_string(store.get(old_id))
        end)

        it("deletes the record when its last value is removed", function()
            local m, store = setup()
            local back = m:load(cookie_of((saved(m, { user = "ada" }))))
            back:set("user", nil)
            assert.matches("Max%-Age=0", m:save(back))
            assert.is_nil(store.get(back.id))
        end)
    end)

    describe("memory_store", function()
        it("keeps a record until its ttl runs out", function()
            local c = clock()
            local store = session.memory_store { now = c.now }
            assert.is_true(store.set("a", "data", 10))
            c.t = c.t + 9
            assert.equal("data", store.get("a"))
            c.t = c.t + 1
            assert.is_nil(store.get("a"))
        end)

        it("deletes a record", function()
            local store = session.memory_store()
            store.set("a", "data", 10)
            store.delete("a")
            assert.is_nil(store.get("a"))
        end)

        it("sweeps out expired records when full, and fails when none are", function()
            local c = clock()
            local store = session.memory_store { now = c.now, max = 2 }
            assert.is_true(store.set("a", "1", 10))
            assert.is_true(store.set("b", "2", 20))
            assert.is_true(store.set("a", "1b", 10))   -- replacing takes no room
            local ok, err = store.set("c", "3", 10)
            assert.is_nil(ok)
            assert.equal("memory store full", err)
            c.t = c.t + 10                             -- "a" expires
            assert.is_true(store.set("c", "3", 10))
            assert.is_nil(store.get("a"))
            assert.equal("2", store.get("b"))
        end)
    end)

    describe("flash messages", function()
        for _, opts in ipairs {
            { "in a cookie", function() return { secret = SECRET } end },
            { "in a store", function() return { secret = SECRET, store = session.memory_store() } end },
        } do
            describe(opts[1], function()
                local m = session.new(opts[2]())

                -- The next request of a browser that got `set_cookie` (nil: it keeps its own).
                local function next_request(jar, set_cookie)
                    if set_cookie then
                        jar.cookie = cookie_of(set_cookie)
                    end
                    return m:load(jar.cookie)
                end

                it("shows a message on the next request only, then drops it", function()
                    local jar = {}
                    local s = next_request(jar)
                    s:set("user", "ada")
                    s:flash("notice", "Saved"):flash("error", "Title too long")
                    assert.same({}, s:flashes()) -- not this request's to show
                    local s2 = next_request(jar, m:save(s))
                    assert.equal("ada", s2:get("user"))
                    assert.is_nil(s2:get("_flash"))
                    assert.same({ { kind = "notice", message = "Saved" },
                        { kind = "error", message = "Title too long" } }, s2:flashes())
                    assert.same({}, s2:flashes()) -- read and cleared
                    local s3 = next_request(jar, m:save(s2))
                    assert.same({}, s3:flashes())
                    assert.equal("ada", s3:get("user"))
                end)

                it("drops unread messages after the next request too", function()
                    local jar = {}
                    local s = next_request(jar)
                    s:flash("notice", "Saved")
                    local s2 = next_request(jar, m:save(s))
                    local set_cookie = m:save(s2) -- not read: still the cookie changes
                    assert.is_string(set_cookie)
                    assert.same({}, next_request(jar, set_cookie):flashes())
                end)

                it("reads one kind, leaving the others for this request", function()
                    local jar = {}
                    local s = next_request(jar)
                    s:set("user", "ada")
                    s:flash("notice", "a"):flash("error", "b"):flash("notice", { n = 3 })
                    local s2 = next_request(jar, m:save(s))
                    assert.same({ "a", { n = 3 } }, s2:flashes("notice"))
                    assert.same({}, s2:flashes("notice"))
                    assert.same({ { kind = "error", message = "b" } }, s2:flashes())
                end)

                it("keeps a message left while showing one for the request after", function()
                    local jar = {}
                    local s = next_request(jar)
                    s:flash("notice", "first")
                    local s2 = next_request(jar, m:save(s))
                    s2:flash("notice", "second")
                    local s3 = next_request(jar, m:save(s2))
                    assert.same({ "second" }, s3:flashes("notice"))
                end)

                it("keeps messages across regenerate, and after destroy", function()
                    local jar = {}
                    local s = next_request(jar)
                    s:set("user", "ada")
                    s:flash("notice", "Welcome"):regenerate()
                    assert.same({ "Welcome" }, next_request(jar, m:save(s)):flashes("notice"))
                    local s2 = next_request(jar)
                    s2:destroy():flash("notice", "Logged out")
                    local s3 = next_request(jar, m:save(s2))
                    assert.is_nil(s3:get("user"))
                    assert.same({ "Logged out" }, s3:flashes("notice"))
                end)

                it("refuses a kind that is not a string and a nil message", function()
                    local s = m:load(nil)
                    assert.has_error(function() s:flash(1, "x") end)
                    assert.has_error(function() s:flash("notice", nil) end)
                end)
            end)
        end
    end)

    describe("new", function()
        local misuse = {
            { "no secret", {} },
            { "a short secret", { secret = "too short" } },
            { "an empty list of secrets", { secrets = {} } },
            { "a short secret in the list", { secrets = { SECRET, "short" } } },
            { "both secret and secrets", { secret = SECRET, secrets = { SECRET } } },
            { "a name that is not a token", { secret = SECRET, name = "my session" } },
            { "a max_age that is not a positive integer", { secret = SECRET, max_age = 0 } },
            { "same_site None without secure",
                { secret = SECRET, cookie = { same_site = "None" } } },
            { "a store without delete",
                { secret = SECRET, store = { get = print, set = print } } },
            { "a clock that is not a function", { secret = SECRET, now = 5 } },
        }
        for _, case in ipairs(misuse) do
            it("raises on " .. case[1], function()
                assert.has_error(function() session.new(case[2]) end)
            end)
        end
    end)
end)
