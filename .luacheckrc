-- luacheck configuration: `luacheck .` from the top of the tree checks lua/, spec/ and
-- examples/ (spec/run runs it; a warning fails the run).
std = "luajit"
include_files = { "lua/**/*.lua", "spec/**/*.lua", "examples/**/*.lua", "spec/lint-tools" }

-- busted's globals (describe, it, assert.same, spy, ...) in the specs.
files["spec/lua"] = { std = "+busted" }
files["spec/it"] = { std = "+busted" }
files["spec/rock"] = { std = "+busted" }
