-- The board's settings, one table per environment over `common` (moonserve.config). A
-- setting declared here is also read from the environment: DATABASE_URL, POOL_SIZE,
-- AVATAR_MAX_BYTES, PAGE_SIZE, SIGNUP_OPEN.
return {
    common = {
        database_url = "postgres://board@127.0.0.1:5432/board",
        pool_size = 8,
        page_size = 20,                 -- notes on a page and in an API page by default
        avatar_max_bytes = 256 * 1024,  -- the upload route's body limit
        signup_open = true,
        -- Pages of other origins whose scripts may call /api with the member's cookie.
        cors_origins = { "http://localhost:5173" },
    },
    development = {},
    test = {
        database_url = "postgres://board@127.0.0.1:5432/board_test",
    },
    production = {
        database_url = "",              -- declared: DATABASE_URL gives it
        pool_size = 16,
        secrets_dir = "/etc/board/secrets",
        cors_origins = { "https://app.example" },
    },
}
