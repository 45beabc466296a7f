-- claim_walk: a row of claim_events' walk (step 1), gathered before its
-- statement: an endpoint met, the limits and cap of its first due event, how
-- long since that event came due if it was parked (overdue), and how many of
-- its events the claim may lock (n: its whole tokens, at most per_endpoint).
CREATE TYPE claim_walk AS (
    endpoint     text,
    limits       text[],
    inflight_key text,
    overdue      float8,
    n            int
);

-- What claim_events needs of ratebucket's views, in functions of their own:
-- a view's plan written into the claim's statement would be set up at
-- every claim, used or not (about a twentieth of a claim's time in one
-- session).  claim_bucket_info: for each key with a bucket, its effective
-- rate now (0 for a calendar quota, which has no rate) and whether it is
-- striped.
CREATE FUNCTION claim_bucket_info(keys text[])
RETURNS TABLE (key text, effective_rate float8, striped boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(keys) > 0 THEN
        RETURN QUERY
        SELECT b.endpoint, b.effective_rate, b.stripes > 1
        FROM ratebucket.bucket_status b
        WHERE b.endpoint = ANY (keys);
    END IF;
END
$$;

-- claim_cap_free: the free slots of an in-flight cap now (NULL if it has
-- no configuration).
-- (PL/pgSQL, whose plans last the session: a SQL function would be planned
-- again at every claim.)
CREATE FUNCTION claim_cap_free(cap_key text) RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT greatest(s.cap - s.in_flight, 0)::int
            FROM ratebucket.inflight_status s
            WHERE s.key = cap_key);
END
$$;
