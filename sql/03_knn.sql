-- k nearest neighbours with ranks; ties go to the earlier base row; k larger than the base.
CREATE TABLE docs (doc VARCHAR, embedding FLOAT[]) AS VALUES
  ('a', [1.0, 0.0]), ('b', [0.0, 1.0]), ('c', [1.0, 1.0]), ('d', [-1.0, 0.0]), ('e', [2.0, 0.0]);
CREATE TABLE questions (q INT, embedding FLOAT[]) AS VALUES (1, [1.0, 0.1]), (2, [0.0, 0.0]);

SELECT query_q, rank, base_doc, round(distance, 6) AS distance
FROM knn(docs, questions, 2, 'metric=cosine')
ORDER BY query_q, rank;

SELECT query_q, rank, base_doc, distance
FROM knn(docs, questions, 10)
WHERE query_q = 2
ORDER BY rank;
