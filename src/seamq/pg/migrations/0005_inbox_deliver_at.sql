-- A delayed event's latency counts from its deliver_at, not from when it occurred: an event
-- scheduled for tomorrow and handled 10 ms after it fell due was handled in 10 ms. The consumer's
-- latency histogram did so from the start (Seamq-Deliver-At); the KPI pipeline reads it from here.
ALTER TABLE inbox_messages ADD COLUMN deliver_at TIMESTAMPTZ;   -- seamq: a delayed event's time
