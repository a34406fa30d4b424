-- The configuration's values as the server reads them: a variable's text typed as its
-- setting is declared (config.typed), and the connection URLs of DATABASE_URL and REDIS_URL
-- (pg.parse_url, redis.url.parse). None raises; each gives a value of the declared kind, or nil
-- and a sentence. (The configuration file itself is a Lua chunk: LuaJIT parses it.)
local config = require "moonserve.config"
local pg = require "moonserve.pg"
local redis_url = require "moonserve.redis.url"
local u = require "fuzz_util"

local DECLARED = { 0, true, "" }

local function answer(what, v, err, kind)
    kind = kind or "table"
    if v == nil then
        assert(type(err) == "string", what .. ": no sentence for a refusal")
    else
        assert(type(v) == kind, what .. ": a " .. type(v) .. " where a " .. kind .. " was due")
    end
end

-- The first byte picks the declared type; the rest is the text.
return function(data)
    local text = data:sub(2)
    local declared = DECLARED[(data:byte(1) or 0) % 3 + 1]
    local v, err = u.no_raise("config.typed", config.typed, text, declared)
    answer("config.typed", v, err, type(declared))
    for _, url in ipairs({ text, "postgres://" .. text }) do
        answer("pg.parse_url", u.no_raise("pg.parse_url", pg.parse_url, url))
    end
    for _, url in ipairs({ text, "redis://" .. text, "redis+sentinel://" .. text }) do
        answer("redis.url.parse", u.no_raise("redis.url.parse", redis_url.parse, url))
    end
end
