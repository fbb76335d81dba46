-- ε self-join of five points; (0,0)-(3,4) is exactly at eps = 5 and is included.
CREATE TABLE points (id INT, x DOUBLE, y DOUBLE) AS VALUES
  (1, 0.0, 0.0), (2, 3.0, 4.0), (3, 6.0, 8.0), (4, 0.0, 5.1), (5, 10.0, 10.0);

SELECT left_id, right_id, distance
FROM sim_join(points, 5)
ORDER BY left_id, right_id;

SELECT left_id, right_id, distance
FROM sim_join(points, 5, 'pairs=unordered, metric=l1')
ORDER BY left_id, right_id;
