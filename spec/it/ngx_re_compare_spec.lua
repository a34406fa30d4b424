-- spec/it/ngx_re_compare_spec.lua: the cases of spec/fixtures/ngx_re_cases.lua through
-- OpenResty's ngx.re (Debian's nginx with libnginx-mod-http-lua and lua-resty-core, on
-- PCRE1) and through moonserve.ngx.re (PCRE2), case by case.
local helper = require "helper"
local socket = require "socket"

local free_port = helper.free_port

local MODULES = "/usr/lib/nginx/modules"
local CASES = helper.root .. "/spec/fixtures/ngx_re_cases.lua"

local function conf(dir, port)
    local t = {}
    for _, m in ipairs({ "ndk_http_module.so", "ngx_http_lua_module.so" }) do
        local f = io.open(MODULES .. "/" .. m)
        if not f then
            error(MODULES .. "/" .. m .. " is missing: install the Debian package "
                .. "libnginx-mod-http-lua")
        end
        f:close()
        t[#t + 1] = "load_module " .. MODULES .. "/" .. m .. ";"
    end
    return table.concat(t, "\n") .. ([[

worker_processes 1;
daemon off;
master_process off;
pid DIR/nginx.pid;
error_log DIR/error.log;
events { worker_connections 16; }
http {
    access_log off;
    client_body_temp_path DIR; proxy_temp_path DIR; fastcgi_temp_path DIR;
    uwsgi_temp_path DIR; scgi_temp_path DIR;
    server {
        listen 127.0.0.1:PORT;
        location / {
            content_by_lua_block {
                local cases = dofile("CASES")
                local split = require "ngx.re"
                ngx.print(cases.run({ match = ngx.re.match, find = ngx.re.find,
                    gmatch = ngx.re.gmatch, sub = ngx.re.sub, gsub = ngx.re.gsub,
                    split = split.split, opt = split.opt }))
            }
        }
    }
}
]]):gsub("DIR", dir):gsub("PORT", tostring(port)):gsub("CASES", CASES)
end

local function lines(text)
    local t = {}
    for line in text:gmatch("[^\n]+") do
        local name, result = line:match("^(.-)\t(.*)$")
        if name then t[name] = result end
    end
    return t
end

describe("ngx.re against OpenResty's", function()
    local cases = dofile(CASES)
    local theirs, ours = {}, {}

    setup(function()
        local dir = helper.sh("mktemp -d"):gsub("%s+$", "")
        local port = free_port()
        helper.write_file(dir .. "/nginx.conf", conf(dir, port))
        local p = io.popen(string.format("%s -p %s -c %s/nginx.conf -e %s/error.log "
            .. ">/dev/null 2>&1 & echo $!", helper.tool("nginx"), dir, dir, dir))
        local pid = p:read("*l")
        p:close()
        local body
        local ok, err = pcall(function()
            helper.wait_for(function()
                local c = socket.connect("127.0.0.1", port)
                if c then c:close() end
                return c ~= nil
            end, 5)
            body = helper.curl("http://127.0.0.1:" .. port .. "/")
        end)
        os.execute("kill " .. pid .. " 2>/dev/null")
        socket.sleep(0.1)
        os.execute("kill -9 " .. pid .. " 2>/dev/null")
        local log = helper.read_file(dir .. "/error.log")
        helper.sh("rm -rf " .. helper.sh_quote(dir))
        assert(ok, err)
        theirs = lines(body)
        assert(next(theirs), "nginx answered no cases: " .. body .. "\n" .. log)
        package.loaded["moonserve.ngx.re"] = nil
        ours = lines(cases.run(require "moonserve.ngx.re"))
    end)

    for _, c in ipairs(cases.cases) do
        local name, why = c[1], c.differs
        if why then
            it("differs as documented: " .. name .. " (" .. why .. ")", function()
                assert.is_string(theirs[name])
                assert.is_string(ours[name])
                assert.are_not.equal(theirs[name], ours[name])
            end)
        else
            it("answers as OpenResty does: " .. name, function()
                assert.is_string(theirs[name])
                assert.equal(theirs[name], ours[name])
            end)
        end
    end
end)
