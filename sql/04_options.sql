-- Session defaults with SET, overridden per call; EXPLAIN shows the operator.
CREATE TABLE v (id INT, x DOUBLE, y DOUBLE) AS VALUES (1, 0.0, 0.0), (2, 1.0, 1.0), (3, 2.0, 0.0);
SET simjoin.metric = 'linf';
SET simjoin.pairs = 'unordered';

SELECT left_id, right_id, distance FROM sim_join(v, 1) ORDER BY left_id, right_id;

SELECT left_id, right_id, distance FROM sim_join(v, 1.5, 'metric=l2, include_self=true') ORDER BY left_id, right_id;
