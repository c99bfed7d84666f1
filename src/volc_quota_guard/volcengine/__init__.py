"""Everything that knows Volcengine: credentials, the billing API, which resource packages
belong to which pool, direct Ark chat calls (the consume task) and Ark's tokenization API.

The guard's core (gate, limit, sync) takes what these modules return as plain values.
"""
