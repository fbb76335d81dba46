-- Range queries over list vectors: a query table and a literal vector.
CREATE TABLE shops (name VARCHAR, location DOUBLE[]) AS VALUES
  ('bakery', [0.0, 0.0]), ('butcher', [1.0, 0.0]), ('florist', [0.0, 2.0]), ('grocer', [3.0, 3.0]);
CREATE TABLE homes (owner VARCHAR, location DOUBLE[]) AS VALUES
  ('ana', [0.5, 0.0]), ('ben', [3.0, 2.0]);

SELECT query_owner, base_name, distance
FROM range_query(shops, homes, 1.0)
ORDER BY query_owner, distance;

SELECT base_name, distance
FROM RANGE_QUERY(shops, '[0, 1]', 1.0, 'metric=linf')
ORDER BY base_name;
