-- An avatar per member, in the row: a small image (the upload's limit bounds it) whose
-- type was checked by its first bytes.
ALTER TABLE users
    ADD COLUMN avatar bytea,
    ADD COLUMN avatar_type text CHECK (avatar_type IN ('image/png', 'image/jpeg', 'image/gif',
                                                       'image/webp'));
