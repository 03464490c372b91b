// placeholder until the location layer lands
