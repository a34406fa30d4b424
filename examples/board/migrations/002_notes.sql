-- Notes, newest first by id; a member's notes go with the member.
CREATE TABLE notes (
    id         bigserial PRIMARY KEY,
    author     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    body       text NOT NULL CHECK (length(body) BETWEEN 1 AND 1000),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notes_author ON notes (author);
