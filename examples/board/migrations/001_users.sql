-- The board's members: a name to log in with and an argon2id hash (moonserve.password),
-- never the password itself.
CREATE TABLE users (
    id            bigserial PRIMARY KEY,
    name          text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_.-]{3,32}$'),
    password_hash text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
