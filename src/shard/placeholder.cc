// placeholder until the shard layer lands
