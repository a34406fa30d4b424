-- moonserve/router.lua: method and path to handler. Literal paths are one hash lookup;
-- patterns (":name" segments, a trailing "*") are tried in order of precedence.
local codec = require "moonserve.codec"

local find, sub = string.find, string.sub

local LITERAL, PARAM, SPLAT = 1, 2, 3

local Router = {}
Router.__index = Router

local _M = {}

function _M.new()
    return setmetatable({ exact = {}, patterns = {}, methods = {} }, Router)
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

local function compile(path)
    if sub(path, 1, 1) ~= "/" then
        error("bad route path " .. path .. " (must start with /)", 3)
    end
    local segs, dynamic = {}, false
    for _, seg in ipairs(split(path)) do
        if seg == "*" then
            segs[#segs + 1] = { kind = SPLAT }
            dynamic = true
        elseif sub(seg, 1, 1) == ":" then
            segs[#segs + 1] = { kind = PARAM, name = sub(seg, 2) }
            dynamic = true
        else
            if #segs > 0 and segs[#segs].kind == SPLAT then
                error("bad route path " .. path .. " (* must come last)", 3)
            end
            segs[#segs + 1] = { kind = LITERAL, text = seg }
        end
    end
    return segs, dynamic
end

-- A literal segment beats :param, which beats *; then the earlier route wins.
local function precedes(a, b)
    for i = 1, math.max(#a.segs, #b.segs) do
        local ka = a.segs[i] and a.segs[i].kind or 0
        local kb = b.segs[i] and b.segs[i].kind or 0
        if ka ~= kb then
            return ka < kb
        end
    end
    return a.order < b.order
end

function Router:add(method, path, handler)
    self.methods[method] = true
    local segs, dynamic = compile(path)
    if not dynamic then
        local t = self.exact[method] or {}
        self.exact[method] = t
        if t[path] == nil then
            t[path] = handler
        end
        return
    end
    local list = self.patterns[method] or {}
    self.patterns[method] = list
    list[#list + 1] = { segs = segs, handler = handler, order = #list + 1 }
    table.sort(list, precedes)
end

local function try(route, parts, path)
    local params
    local segs = route.segs
    for i = 1, #segs do
        local s = segs[i]
        local p = parts[i]
        if s.kind == SPLAT then
            -- the rest of the path, from this segment on
            local pos = 1
            for _ = 1, i do
                pos = find(path, "/", pos, true) + 1
            end
            params = params or {}
            params.splat = codec.unescape(sub(path, pos))
            return params
        end
        if p == nil then
            return nil
        end
        if s.kind == LITERAL then
            if p ~= s.text then
                return nil
            end
        else
            if p == "" then
                return nil
            end
            params = params or {}
            params[s.name] = codec.unescape(p)
        end
    end
    if #parts ~= #segs then
        return nil
    end
    return params or {}
end

local function lookup(self, method, path, parts)
    local t = self.exact[method]
    local h = t and t[path]
    if h then
        return h -- no captures: the request makes its params table only if asked
    end
    local list = self.patterns[method]
    if list then
        parts = parts or split(path)
        for i = 1, #list do
            local params = try(list[i], parts, path)
            if params then
                return list[i].handler, params
            end
        end
    end
    return nil, nil, parts
end

-- Iterates over every route's value: for _, value in router:routes().
function Router:routes()
    local all = {}
    for _, t in pairs(self.exact) do
        for _, v in pairs(t) do
            all[#all + 1] = v
        end
    end
    for _, list in pairs(self.patterns) do
        for _, r in ipairs(list) do
            all[#all + 1] = r.handler
        end
    end
    return ipairs(all)
end

-- Returns handler, params (nil for a literal route); or nil, nil, allow (the methods that have the path: 405) when
-- the path is known for other methods; or nil when nothing matches (404). HEAD falls back to
-- GET.
function Router:match(method, path)
    local h, params, parts = lookup(self, method, path)
    if h then
        return h, params
    end
    if method == "HEAD" then
        h, params, parts = lookup(self, "GET", path, parts)
        if h then
            return h, params
        end
    end
    local allow
    for m in pairs(self.methods) do
        if m ~= method and lookup(self, m, path, parts) then
            allow = allow or {}
            allow[#allow + 1] = m
        end
    end
    if allow then
        table.sort(allow)
        return nil, nil, table.concat(allow, ", ")
    end
    return nil
end

return _M
