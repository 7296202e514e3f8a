-- How each turn's question was asked: 'text' (typed), 'voice' (a voice, audio or video note; `question` holds its
-- transcript) or 'photo' (a question about a picture, which is not stored). /trace shows it.
ALTER TABLE turns ADD COLUMN input_kind TEXT NOT NULL DEFAULT 'text';
