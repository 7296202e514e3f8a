-- The course database from the original article, seeded with its four courses.
CREATE TABLE courses (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE CHECK (length(trim(name)) > 0),
    lessons INTEGER NOT NULL CHECK (lessons >= 0),
    updates_per_week INTEGER NOT NULL CHECK (updates_per_week >= 0),
    hours_per_update REAL NOT NULL CHECK (hours_per_update >= 0),
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

INSERT INTO courses (name, lessons, updates_per_week, hours_per_update) VALUES
    ('大模型技术实战', 200, 3, 2),
    ('机器学习实战', 230, 2, 1.5),
    ('深度学习实战', 150, 1, 3),
    ('AI数据分析', 10, 1, 1);
