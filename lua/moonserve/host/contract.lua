-- moonserve/host/contract.lua: what a host's request and reply objects must have for the
-- framework, its middleware and the methods both hosts share (request_methods.lua,
-- response_methods.lua) to run on them: the core's (moonserve/host/core/request.lua,
-- response.lua) and OpenResty's (moonserve/host/openresty/request.lua, response.lua) both
-- have every name below (spec/lua/host_contract_spec.lua). A name with `_` first is the
-- framework's, not the app's.
return {
    -- The request's fields, read as req.NAME (each host computes them at the first read).
    request_fields = {
        "client_ip", "cookies", "ctx", "http_version", "id", "method", "params", "path",
        "query", "query_string", "scheme", "target", "tls", "trusted_proxy",
    },
    -- The request's methods.
    request_methods = {
        "accepts", "body", "body_limit", "cpu_budget", "form", "header", "headers", "json",
        "parts",
        "query_all", "read", "trailers",
        "_access", "_metric", "_read", "_static_dir", "_unread",
    },
    -- The reply's methods.
    response_methods = {
        "before_send", "cookie", "error_json", "fields", "file", "flush", "get_status", "gone",
        "header", "invalid", "json", "redirect", "render", "send", "sent", "static_mount", "status", "trailer",
        "write",
        "_add_header", "_fields_checked", "_ngx_begin", "_reset", "_url_check",
    },
}
