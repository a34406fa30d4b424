--- moonserve/router.lua: method and path to a route, through a trie of path segments.
-- A lookup walks the path's segments, one hash lookup each, so its cost depends on the
-- path, not on how many routes there are. At each segment a literal beats ":name", which
-- beats a trailing "*"; among equals the route added first wins.
--
-- `Router`: A router: routes by method and path pattern (`/users/:id`, `/files/*`).
-- @module moonserve.router
local codec = require "moonserve.codec"

local byte, find, sub, gsub, concat = string.byte, string.find, string.sub, string.gsub,
    table.concat

local Router = {}
Router.__index = Router

local _M = {}

local function new_node()
    return { children = nil, param = nil, splat = nil, routes = nil }
end

--- An empty router: a trie of path segments per method.
-- @treturn Router
function _M.new()
    return setmetatable({ root = new_node(), exact = {}, methods = {}, method_list = {},
        named = {}, all = {}, cache = {}, cache_allow = {}, cached = 0 }, Router)
end

-- "/a/b/" -> { "a", "b", "" }: exactly the pieces between slashes.
local function split(path)
    local parts, pos = {}, 2
    while true do
        local slash = find(path, "/", pos, true)
        if not slash then
            parts[#parts + 1] = sub(path, pos)
            return parts
        end
        parts[#parts + 1] = sub(path, pos, slash - 1)
        pos = slash + 1
    end
end

--- Adds a route: `value` is what match() returns for it (a handler, or a table).
-- Returns the route record { method, path, value, names, name }.
function Router:add(method, path, value, name)
    if type(path) ~= "string" or sub(path, 1, 1) ~= "/" then
        error("bad route path " .. tostring(path) .. " (must start with /)", 2)
    end
    local route = { method = method, path = path, value = value, names = {}, name = name }
    local node, literal = self.root, true
    local segs = split(path)
    for i, seg in ipairs(segs) do
        if seg == "*" then
            if i ~= #segs then
                error("bad route path " .. path .. " (* must come last)", 2)
            end
            node.splat = node.splat or new_node()
            node = node.splat
            route.splat = true
            literal = false
        elseif sub(seg, 1, 1) == ":" then
            if #seg == 1 then
                error("bad route path " .. path .. " (a : without a name)", 2)
            end
            node.param = node.param or new_node()
            node = node.param
            route.names[#route.names + 1] = sub(seg, 2)
            literal = false
        else
            node.children = node.children or {}
            local child = node.children[seg]
            if not child then
                child = new_node()
                node.children[seg] = child
            end
            node = child
        end
    end
    node.routes = node.routes or {}
    if node.routes[method] == nil then -- the first one added wins
        node.routes[method] = route
    end
    if literal then
        self.exact[path] = node
    end
    if name then
        if self.named[name] then
            error("route name " .. name .. " is taken", 2)
        end
        self.named[name] = route
    end
    if not self.methods[method] then
        self.methods[method] = true
        self.method_list[#self.method_list + 1] = method
    end
    self.all[#self.all + 1] = route
    -- earlier walks may now have a better answer
    self.cache, self.cache_allow, self.cached = {}, {}, 0
    return route
end

-- Depth-first over the path's segments in precedence order (literal, then :param, then *),
-- backtracking when a branch leads nowhere. Iterative, on stacks kept between calls (no
-- handler runs inside, so nothing re-enters), and without splitting the path into a table:
-- the JIT compiles it, where a recursive walk would not be.
local S_node, S_pos, S_n, S_stage = {}, {}, {}, {}
local caps = {} -- the segments taken by ":name", then caps.splat; read at once by the caller

local function walk(root, path, method)
    -- The walk starts after the leading "/", which it checks rather than assumes: a path
    -- without one ("Xadmin/secret") is no route's, and must not be served as "/admin/secret"
    -- past whatever checked its own reading of it.
    if byte(path, 1) ~= 47 then
        return nil
    end
    local len = #path
    local top = 1
    S_node[1], S_pos[1], S_n[1], S_stage[1] = root, 2, 0, 0
    caps.splat = nil
    while top > 0 do
        local node, pos, n = S_node[top], S_pos[top], S_n[top]
        if pos > len + 1 then -- every segment is matched
            local routes = node.routes
            local route = routes and routes[method]
            if route then
                return route, n
            end
            top = top - 1
        else
            local slash = find(path, "/", pos, true) or len + 1
            local stage = S_stage[top]
            S_stage[top] = stage + 1
            if stage == 0 then
                local children = node.children
                local child = children and children[sub(path, pos, slash - 1)]
                if child then
                    top = top + 1
                    S_node[top], S_pos[top], S_n[top], S_stage[top] = child, slash + 1, n, 0
                end
            elseif stage == 1 then
                if node.param and slash > pos then
                    caps[n + 1] = sub(path, pos, slash - 1)
                    top = top + 1
                    S_node[top], S_pos[top], S_n[top], S_stage[top] = node.param, slash + 1, n + 1, 0
                end
            else
                top = top - 1
                local splat = node.splat
                local route = splat and splat.routes and splat.routes[method]
                if route then
                    caps.splat = sub(path, pos)
                    return route, n
                end
            end
        end
    end
    return nil
end

-- A walk's result for one method and path, decoded: { route, name = value ... }.
local function remember(route)
    local hit = { route }
    local names = route.names
    for j = 1, #names do
        hit[names[j]] = codec.unescape(caps[j])
    end
    if caps.splat then
        hit.splat = codec.unescape(caps.splat)
    end
    return hit
end

-- Recent walks are kept per method and path: the walk is a loop, which takes the request
-- out of its compiled trace, while a hit is a table lookup. The cache is dropped when full
-- (paths with ids are many) and when routes change.
local CACHE_MAX = 4096

-- A fresh params table from a cached walk (handlers may change theirs).
local function params_from(hit, names, splat)
    local params = {}
    local k = #names
    if k > 0 then
        params[names[1]] = hit[names[1]]
        if k > 1 then
            params[names[2]] = hit[names[2]]
            for j = 3, k do -- three or more captures: rare
                params[names[j]] = hit[names[j]]
            end
        end
    end
    if splat then
        params.splat = hit.splat
    end
    return params
end

local function lookup(self, method, path)
    local node = self.exact[path]
    local route = node and node.routes[method]
    if route then
        return route.value, nil, route -- no captures: params are made only if asked for
    end
    local cache = self.cache[method]
    local hit = cache and cache[path]
    if hit == nil then
        route = walk(self.root, path, method)
        hit = route and remember(route) or false
        if self.cached >= CACHE_MAX then
            self.cache, self.cache_allow, self.cached = {}, {}, 0
            cache = nil
        end
        if not cache then
            cache = {}
            self.cache[method] = cache
        end
        cache[path] = hit
        self.cached = self.cached + 1
    end
    if not hit then
        return nil
    end
    route = hit[1]
    return route.value, params_from(hit, route.names, route.splat), route
end

--- The methods that have a route for `path`, sorted and joined for Allow.
function Router:allowed(path)
    local allow = {}
    local list = self.method_list
    for k = 1, #list do -- a list, not pairs(): the JIT compiles it
        local m = list[k]
        local node = self.exact[path]
        if (node and node.routes[m]) or walk(self.root, path, m) then
            allow[#allow + 1] = m
        end
    end
    if #allow == 0 then
        return nil
    end
    if self.methods.GET and not self.methods.HEAD then
        for _, m in ipairs(allow) do
            if m == "GET" then
                allow[#allow + 1] = "HEAD"
                break
            end
        end
    end
    table.sort(allow)
    return concat(allow, ", ")
end

--- Returns value, params (nil for a literal route), nil, the route record; or nil, nil,
-- allow when the path has routes for other methods only (405); or nil (404). HEAD falls
-- back to GET.
function Router:match(method, path)
    local value, params, route = lookup(self, method, path)
    if value then
        return value, params, nil, route
    end
    if method == "HEAD" then
        value, params, route = lookup(self, "GET", path)
        if value then
            return value, params, nil, route
        end
    end
    -- The 405 check walks for every method: remembered like a walk (false: a 404).
    local known = self.cache_allow
    local allow = known[path]
    if allow == nil then
        if self.cached >= CACHE_MAX then
            self.cache, self.cache_allow, self.cached = {}, {}, 0
            known = self.cache_allow
        end
        allow = self:allowed(path) or false
        known[path] = allow
        self.cached = self.cached + 1
    end
    return nil, nil, allow or nil
end

--- Every route's value: for _, value in router:routes().
function Router:routes()
    local values = {}
    for i, route in ipairs(self.all) do
        values[i] = route.value
    end
    return ipairs(values)
end

--- The path of the route called `name`, with its ":name" segments and "*" filled from
-- `params` (escaped). Raises on an unknown name or a missing parameter.
function Router:url_for(name, params)
    local route = self.named[name]
    if not route then
        error("no route named " .. tostring(name), 2)
    end
    params = params or {}
    local missing
    local path = gsub(route.path, "/:([^/]+)", function(key)
        local v = params[key]
        if v == nil then
            missing = key
            return ""
        end
        return "/" .. codec.escape(tostring(v))
    end)
    if missing then
        error("url_for " .. name .. ": no value for :" .. missing, 2)
    end
    if route.splat then
        local rest = tostring(params.splat or "")
        path = sub(path, 1, -2) .. gsub(rest, "[^/]+", codec.escape)
    end
    return path
end

return _M
