"""A Kafka topic as the main input: its declaration (:mod:`.declaration`,
``MainInput.kafka``), the source that reads exact offset ranges (:mod:`.source`), the
next batch's ranges checked against the brokers (:mod:`.offsets`), the connector's rows
as records (:mod:`.decode`), the brokers' offsets and topic ids (:mod:`.admin`), and
pre-keyed topics (:mod:`.keyed`).

An operator without Kafka never loads these modules but the declaration.
"""
