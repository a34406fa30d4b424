-- spec/lua/config_spec.lua: moonserve.config and moonserve.secret: the file per environment,
-- the variables over it, typing, secrets from files and the environment, and every error.
local helper = require "helper"
local ffi = require "ffi"

local function setenv(k, v)
    if v == nil then
        ffi.C.unsetenv(k)
    else
        ffi.C.setenv(k, v, 1)
    end
end

-- Runs fn with the variables of `vars` set, then as they were.
local function with_env(vars, fn)
    local was = {}
    for k, v in pairs(vars) do
        was[k] = os.getenv(k)
        setenv(k, v)
    end
    local ok, err = pcall(fn)
    for k in pairs(vars) do
        setenv(k, was[k])
    end
    if not ok then
        error(err, 0)
    end
end

local function tmpdir()
    local d = os.tmpname()
    os.remove(d)
    assert(os.execute("mkdir -m 700 " .. d) == 0)
    return d
end

local function write(path, text, mode)
    helper.write_file(path, text)
    assert(os.execute("chmod " .. (mode or "600") .. " " .. path) == 0)
end

describe("moonserve.config", function()
    local config = require "moonserve.config"
    local moonserve = require "moonserve"
    local dir

    before_each(function()
        dir = tmpdir()
        config.reset()
    end)

    after_each(function()
        os.execute("rm -rf " .. dir)
        config.reset()
    end)

    local function app_with(text)
        if text then
            write(dir .. "/config.lua", text)
        end
        config.setup { app = dir .. "/app.lua" }
    end

    it("runs in development with no configuration file, and unknown keys are nil", function()
        app_with(nil)
        assert.equal("development", moonserve.env)
        assert.same({}, moonserve.config)
        assert.is_nil(moonserve.config.anything)
    end)

    it("merges the environment's table over common, key by key", function()
        app_with [[return {
            common = { greeting = "hello", db = { pool = 4, host = "localhost" } },
            production = { greeting = "welcome", db = { pool = 16 } },
        }]]
        assert.same({ greeting = "hello", db = { pool = 4, host = "localhost" } },
            moonserve.config)
        config.setup { app = dir .. "/app.lua", env = "production" }
        assert.same({ greeting = "welcome", db = { pool = 16, host = "localhost" } },
            moonserve.config)
        assert.equal("production", moonserve.env)
    end)

    it("takes the environment from MOONSERVE_ENV, and --env over it", function()
        app_with [[return { staging = { x = 1 }, production = { x = 2 } }]]
        with_env({ MOONSERVE_ENV = "staging" }, function()
            assert.equal(1, moonserve.config.x)
            config.setup { app = dir .. "/app.lua", env = "production" }
            assert.equal(2, moonserve.config.x)
        end)
    end)

    it("refuses an environment the file does not name, naming those it does", function()
        app_with [[return { common = {}, production = {}, staging = {} }]]
        config.setup { app = dir .. "/app.lua", env = "prodution" }
        assert.has_error(function() return moonserve.config end,
            'unknown environment "prodution": ' .. dir .. "/config.lua has production, "
            .. "staging (and development)")
    end)

    it("knows development, test and production without a file, and nothing else", function()
        config.setup { app = dir .. "/app.lua", env = "test" }
        assert.same({}, moonserve.config)
        config.setup { app = dir .. "/app.lua", env = "staging" }
        assert.has_error(function() return moonserve.config end,
            'unknown environment "staging" (no configuration file: development, test or '
            .. "production)")
    end)

    it("fails on a named file that is not there", function()
        config.setup { file = dir .. "/nope.lua" }
        assert.has_error(function() return moonserve.config end,
            "cannot read the configuration " .. dir .. "/nope.lua: no such file")
    end)

    it("fails on a file of the wrong shape, saying what it should be", function()
        app_with [[return 42]]
        assert.has_error(function() return moonserve.config end, "the configuration " .. dir
            .. "/config.lua must return a table: { common = { ... }, development = { ... }, "
            .. "production = { ... } }")
        app_with [[return { port = 8080 }]]
        assert.has_error(function() return moonserve.config end, "the configuration " .. dir
            .. "/config.lua: port is not an environment (each key names one, or is common, "
            .. "and holds a table)")
        app_with [[return { common = { f = function() end } }]]
        assert.has_error(function() return moonserve.config end, dir
            .. "/config.lua: common.f is a function (settings are strings, numbers, booleans "
            .. "and tables of those)")
        app_with [[return { common = { x = } }]]
        local _, err = pcall(function() return moonserve.config end)
        assert.matches("^cannot read the configuration: .*config.lua:1:", err)
        app_with [[error("no database")]]
        _, err = pcall(function() return moonserve.config end)
        assert.matches("^the configuration .*config.lua failed: .*no database", err)
    end)

    it("overlays declared settings from the environment, typed as declared", function()
        app_with [[return { common = { database_url = "", pool_size = 4, debug = false,
            redis = { url = "redis://a", timeout = 1.5 }, name = "x" } }]]
        with_env({ DATABASE_URL = "postgres://db/app", POOL_SIZE = "32", DEBUG = "yes",
            REDIS__TIMEOUT = "2.25", NAME = "123", UNDECLARED = "u" }, function()
            local c = moonserve.config
            assert.equal("postgres://db/app", c.database_url)
            assert.equal(32, c.pool_size)
            assert.equal(true, c.debug)
            assert.equal(2.25, c.redis.timeout)
            assert.equal("redis://a", c.redis.url)
            assert.equal("123", c.name) -- a string setting stays a string
            assert.is_nil(c.undeclared)
            assert.same({ "DATABASE_URL", "DEBUG", "NAME", "POOL_SIZE", "REDIS__TIMEOUT" },
                config.describe().from)
        end)
    end)

    it("never reads the login's own variables as settings", function()
        app_with [[return { common = { user = "app", path = "/srv", home = "/h" } }]]
        with_env({ USER = "root", PATH = "/bin", HOME = "/root" }, function()
            assert.same({ user = "app", path = "/srv", home = "/h" }, moonserve.config)
        end)
    end)

    it("fails on a variable that does not read as its setting's type", function()
        app_with [[return { common = { pool_size = 4, debug = false } }]]
        with_env({ POOL_SIZE = "many" }, function()
            assert.has_error(function() return moonserve.config end,
                "POOL_SIZE: a number expected (the setting pool_size is a number)")
        end)
        config.reset()
        with_env({ DEBUG = "maybe" }, function()
            app_with [[return { common = { debug = false } }]]
            assert.has_error(function() return moonserve.config end,
                "DEBUG: true or false (1, 0, yes, no, on, off) expected (the setting debug "
                .. "is a boolean)")
        end)
    end)

    it("reads typed values: numbers, booleans, strings", function()
        assert.equal(8, config.typed("8", 1))
        assert.equal(false, config.typed("off", true))
        assert.equal("8", config.typed("8", "s"))
        assert.equal("REDIS__POOL_SIZE", config.variable { "redis", "pool_size" })
        assert.is_nil(config.variable { "with-dash" })
    end)

    it("reads the file again on reload, with the environment's name and the seed kept", function()
        app_with [[return { common = { greeting = "hello" } }]]
        local before = moonserve.secret("session")
        assert.equal("hello", moonserve.config.greeting)
        write(dir .. "/config.lua", [[return { common = { greeting = "hi" } }]])
        assert.equal("hello", moonserve.config.greeting) -- read once
        local bytes = assert(config.reload())
        assert.equal("hi", moonserve.config.greeting)
        assert.equal(before, moonserve.secret("session"))
        local decoded = require("string.buffer").decode(bytes)
        assert.equal("hi", decoded.settings.greeting)
        write(dir .. "/config.lua", [[return {]])
        local none, err = config.reload()
        assert.is_nil(none)
        assert.matches("^cannot read the configuration", err)
        assert.equal("hi", moonserve.config.greeting) -- the old one stays
    end)
end)

describe("moonserve.secret", function()
    local config = require "moonserve.config"
    local moonserve = require "moonserve"
    local dir, secrets
    local SECRET = string.rep("s3cr3t-", 6)

    before_each(function()
        dir = tmpdir()
        secrets = dir .. "/secrets"
        os.execute("mkdir -m 700 " .. secrets)
        write(dir .. "/config.lua", ([[return { common = { secrets_dir = %q },
            production = {} }]]):format(secrets))
        config.setup { app = dir .. "/app.lua", env = "production" }
    end)

    after_each(function()
        os.execute("rm -rf " .. dir)
        config.reset()
    end)

    it("reads a file in secrets_dir, without its last newline", function()
        write(secrets .. "/session", SECRET .. "\n")
        assert.equal(SECRET, moonserve.secret("session"))
        assert.same({ 'session (the file ' .. secrets .. '/session)' },
            config.describe().secrets)
    end)

    it("refuses a file others may read, as ssh refuses a key", function()
        write(secrets .. "/session", SECRET, "644")
        local ok, err = pcall(moonserve.secret, "session")
        assert.is_false(ok)
        assert.equal('secret "session": ' .. secrets .. "/session may be read by others (mode "
            .. "0644): it is refused, as ssh refuses such a key; chmod 600 it (or 400)", err)
        assert.falsy(err:find(SECRET, 1, true))
    end)

    it("reads $CREDENTIALS_DIRECTORY after secrets_dir, then MOONSERVE_SECRET_<NAME>", function()
        local creds = dir .. "/creds"
        os.execute("mkdir -m 700 " .. creds)
        write(creds .. "/api-key", "C" .. SECRET)
        with_env({ CREDENTIALS_DIRECTORY = creds, MOONSERVE_SECRET_API_KEY = "E" .. SECRET,
            MOONSERVE_SECRET_TOKEN = "T" .. SECRET }, function()
            assert.equal("C" .. SECRET, moonserve.secret("api-key"))
            assert.equal("T" .. SECRET, moonserve.secret("token"))
            write(secrets .. "/token", "F" .. SECRET)
            config.setup { app = dir .. "/app.lua", env = "production" }
            assert.equal("F" .. SECRET, moonserve.secret("token")) -- the file first
        end)
    end)

    it("fails outside development when there is none, naming where it looked", function()
        local ok, err = pcall(moonserve.secret, "session")
        assert.is_false(ok)
        assert.equal('secret "session" not found in the production environment: no file '
            .. secrets .. "/session (secrets_dir), no $CREDENTIALS_DIRECTORY, no variable "
            .. "MOONSERVE_SECRET_SESSION (only development draws one at random)", err)
    end)

    it("fails on a secret too short, without showing it", function()
        with_env({ MOONSERVE_SECRET_SESSION = "short-one" }, function()
            local ok, err = pcall(moonserve.secret, "session")
            assert.is_false(ok)
            assert.equal('secret "session" from the variable MOONSERVE_SECRET_SESSION is 9 '
                .. "bytes; at least 32 expected", err)
            assert.equal("short-one", moonserve.secret("session", { min_bytes = 8 }))
        end)
    end)

    it("refuses a name that could leave the directory", function()
        assert.has_error(function() moonserve.secret("../etc/passwd") end,
            "bad secret name (letters, digits, _ . - expected)")
    end)

    it("draws one in development, the same for a name from the same seed", function()
        config.setup { app = dir .. "/app.lua", env = "development" }
        local a = moonserve.secret("session")
        assert.equal(32, #a)
        assert.equal(a, moonserve.secret("session"))
        assert.not_equal(a, moonserve.secret("other"))
        assert.equal(64, #moonserve.secret("long", { min_bytes = 64 }))
        -- What a worker inherits derives the same bytes, even for a name first asked there.
        local st = require("string.buffer").decode(config.snapshot())
        assert.equal(a, st.secrets.session)
        local again = moonserve.secret("late")
        config.reset()
        config.adopt(require("string.buffer").encode(st))
        assert.equal(a, moonserve.secret("session"))
        assert.equal(again, moonserve.secret("late"))
    end)
end)
