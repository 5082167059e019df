"""What one call is made of, whatever it is: the reduction operators (`ops`), how a
call's arguments are shaped into the engine's (`shaping`), which thread issues it
(`issuer`), the errors of a call this rank refused (`refusal`), a call in flight (`work`),
point-to-point messages (`p2p`), windows (`windows`) and collectives made of others
(`composite`). Nothing here knows compression or membership."""
