-- router_bench.lua: route lookups with few or many routes, for callgrind (bench/instructions).
--   luajit bench/router_bench.lua N [PIPELINE-unused] ROUTES
-- Half the routes are literal (/items/<i>), half have a :param (/users/:id/things/<i>);
-- each lookup goes through the trie for a :param route.
local n = tonumber(arg[1]) or 100000
local routes = tonumber(os.getenv("ROUTES") or arg[3]) or 10
local router = require("moonserve.router")
local r = router.new()
for i = 1, routes / 2 do
    r:add("GET", "/items/" .. i, i)
    r:add("GET", "/users/:id/things/" .. i, -i)
end
local path = "/users/u1/things/" .. math.floor(routes / 4)
local found = 0
for _ = 1, n do
    if r:match("GET", path) then
        found = found + 1
    end
end
print(("%d lookups, %d found, %d routes"):format(n, found, routes))
