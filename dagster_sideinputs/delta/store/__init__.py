"""Where the lake and the operator's state live: files under a table root (``files``),
conditional writes on object stores (``object_store``) and the lease built on them
(``lease``), one S3 configuration for delta-rs and Spark (``s3``), and a store's failures
told apart (``errors``)."""
